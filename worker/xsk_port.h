/* SPDX-License-Identifier: MIT */
/*
 * xsk_port.h - one AF_XDP socket and its UMEM, through libxdp's xsk_* helpers.
 *
 * The UMEM is split once: the first half of its frames belongs to the kernel's
 * receive path (they cycle fill ring -> rx ring -> fill ring), the second half
 * to transmission (free stack -> tx ring -> completion ring -> free stack).
 * The socket is bound in copy mode (XDP_COPY: veth has no zero-copy) to one
 * queue, without libxdp's default program (XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD):
 * the caller attaches xdp/swml_redirect.c and passes its XSKMAP, where the
 * socket is inserted at its queue's index.
 */
#ifndef SWML_XSK_PORT_H
#define SWML_XSK_PORT_H

#include <stddef.h>
#include <stdint.h>

#include <linux/if_xdp.h>
#include <xdp/xsk.h>

/* One page: a frame holds the largest frame native XDP takes
 * (SWML_PAGE_FRAME_LEN, 3520 B, xdp/swml_wire.h) after the kernel's
 * XDP_PACKET_HEADROOM (256 B) on receive. */
#define SWML_XSK_FRAME_SIZE 4096u
#define SWML_XSK_RX_RING 2048u
#define SWML_XSK_TX_RING 2048u
#define SWML_XSK_FILL_RING 4096u /* > rx frames: a refill always fits */
#define SWML_XSK_COMP_RING 4096u
/* Where a packet starts inside a tx frame: 6 puts the payload (after the 58
 * header bytes) on a 64-byte boundary. */
#define SWML_XSK_TX_OFFSET 6u

struct swml_xsk {
	struct xsk_umem *umem;
	struct xsk_socket *xsk;
	struct xsk_ring_prod fill, tx;
	struct xsk_ring_cons comp, rx;
	uint8_t *area;
	size_t area_len;
	uint32_t nframes;  /* total; half rx, half tx */
	uint64_t *free_tx; /* stack of free tx frame addresses */
	uint32_t n_free_tx;
	uint32_t tx_unsubmitted; /* reserved in the tx ring, not yet submitted */
	int fd;
	uint32_t queue;
	uint64_t kicks, kick_errors;
	int zero_copy; /* bound in zero-copy mode (the driver has it), else copy mode */
};

/* Create UMEM + socket on ifname/queue in zero-copy mode where the driver
 * has it, else in copy mode, fill the fill ring and
 * insert the socket into xskmap_fd (if >= 0). On failure returns -errno and
 * writes a message into err. */
int swml_xsk_open(struct swml_xsk *x, const char *ifname, uint32_t queue, uint32_t nframes,
		  int xskmap_fd, char *err, size_t errlen);
void swml_xsk_close(struct swml_xsk *x);

/* Completed tx frames back onto the free stack; returns how many. */
uint32_t swml_xsk_reclaim(struct swml_xsk *x);

/* A free tx frame and a tx ring slot for a packet of len bytes; returns a
 * pointer where the packet is to be written, or NULL when either is lacking.
 * The descriptor counts after swml_xsk_submit(). */
uint8_t *swml_xsk_tx_reserve(struct swml_xsk *x, uint32_t len);
/* Publish the reserved descriptors. */
void swml_xsk_submit(struct swml_xsk *x);
/* Descriptors the kernel has not consumed yet. */
uint32_t swml_xsk_tx_pending(struct swml_xsk *x);
/* Make the kernel transmit what is in the tx ring (copy mode needs a sendto;
 * each call sends a bounded batch, so it repeats while the kernel says
 * EAGAIN and descriptors remain). Returns 0 or -errno of a hard error. */
int swml_xsk_kick(struct swml_xsk *x);

/* Give rx frames back to the kernel (addresses from rx descriptors). */
void swml_xsk_refill(struct swml_xsk *x, const uint64_t *addrs, uint32_t n);

/* getsockopt(XDP_STATISTICS); 0 or -errno. */
int swml_xsk_statistics(struct swml_xsk *x, struct xdp_statistics *st);

#endif /* SWML_XSK_PORT_H */
