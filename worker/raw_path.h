/* SPDX-License-Identifier: MIT */
/*
 * raw_path.h - the path's ceiling: a ping-pong of swml-sized frames through
 * the trivial reflector on the box's port (xdp/swml_reflect.c), through the
 * same port as the afxdp engine (port.h: its AF_XDP socket and UMEM code, and
 * in copy mode the UDP socket with GSO for the sends), with no quantization
 * and no aggregation (docs/performance.md, "The path's ceiling").
 *
 * Frames are those of a DATA packet with k int32 elements (74 + 4k bytes,
 * packet.h's template) whose swml header says RESULT, so that the worker's
 * own redirect program (xdp/swml_redirect.c, compiled with the reflector as
 * "the switch") hands the echoes to the socket as it hands RESULTs: the same
 * XDP work on both ends as swml's. Each carries its number in the header's
 * seq; an echo must be the frame sent, addresses swapped, byte for byte.
 *
 * `window` frames are kept in flight; each loop takes up to
 * SWML_PORT_RX_BATCH echoes, sends one frame for each (and for any room in the window), and kicks the
 * socket once every `batch` frames, as the engine's loop does. Frames that never come back (no
 * echo for SWML_RAW_LOSS_NS) are counted lost and the window refilled: a
 * real loss, or a loaded machine that held the echoes back (they come back
 * `late`).
 */
#ifndef SWML_RAW_PATH_H
#define SWML_RAW_PATH_H

#include <stdint.h>

#include "packet.h"
#include "port.h"

#define SWML_RAW_BATCH 64            /* the engine's rx batch (stream.c) */
#define SWML_RAW_LOSS_NS 50000000ull /* 50 ms without an echo: the rest is lost */
#define SWML_RAW_SLEEP_NS 1000000ull /* the abort flag is read at least this often */

struct swml_raw_cfg {
	struct swml_addrs addrs;        /* dst: the reflector's address and port */
	uint32_t k;                     /* int32 elements a frame */
	uint32_t window;                /* frames in flight */
	uint32_t batch;                 /* frames a kick (<= SWML_PORT_RX_BATCH) */
	uint32_t spin;                  /* empty polls before sleeping in ppoll() */
	uint64_t warmup_ns;             /* run this long before counting */
	uint64_t duration_ns;           /* then count for this long */
	const volatile uint32_t *abort; /* nonzero: stop */
};

struct swml_raw_result {
	uint64_t sent, echoed; /* in the counted part */
	uint64_t bad;          /* frames in the rx ring that were not an intact echo */
	uint64_t lost, late;   /* never came back; came back after being counted lost */
	uint64_t elapsed_ns;   /* the counted part's length */
	uint64_t kicks, sleeps;
	uint32_t frame_len;
};

/* Run the ping-pong on an open port (AF_XDP: swml_port_open with an
 * xskmap_fd); 0, or -errno of a socket error, or -EINVAL for a frame or
 * window the socket cannot hold. */
int swml_raw_run(struct swml_port *p, const struct swml_raw_cfg *cfg, struct swml_raw_result *r);

#endif /* SWML_RAW_PATH_H */
