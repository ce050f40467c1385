/* SPDX-License-Identifier: MIT */
/*
 * stream.h - streaming one tensor through the job's slots (the hot loop).
 *
 * The rules are those of switchml_xdp/client/plans.py + calls.py +
 * udp_backend.py, so that afxdp and udp workers can share a job:
 *   packet i of the job's life (next_index + p) -> slot i mod S, version bit
 *   (i div S) mod 2, seq (seq_base + i) mod 2^32; packet p may go once (p < S
 *   or result(p-S) is in) and (p < lag or result(p-lag) is in); lag = S for
 *   int32 and float32 MIN/MAX (the order-preserving map, quant.h), W = min(S,
 *   blocks rounded up to the job's lanes, cfg) for a float32 SUM, which has
 *   blocks + W packets: packet p carries
 *   block p's local exponent (-128 past the last block) and block p-W quantized
 *   with the exponent the switch returned with packet p-W (zeros for p < W):
 *   k int32 (quant.h, SWML_FMT_INT32) or, at fmt SWML_FMT_INT16, k int16 (the
 *   16-bit format, quant16.py: the same exponent round, half the bytes).
 * A call with a shard (a reduce_scatter: each rank keeps shard elements) names
 * in each DATA packet the rank whose shard holds all of its block
 * (swml_shard_owner); under --fanout unicast the switch sends the others a
 * header-only RESULT, which completes the packet but writes nothing out.
 * Every DATA packet carries the job's key and the call's op and tag. A RESULT
 * counts only from the switch's address and port, for this job, with the
 * authenticator of the job's result key (before anything in it is read), the seq
 * of a packet in flight on its slot and the call's tag, op and fmt; one flagged
 * DISAGREE ends the call (SWML_DISAGREE), whatever its fmt. After any failed call next_index
 * moves to align_up(call start + SWML_SEQ_RESYNC_STRIDE, 2 S), as on every
 * other rank that failed it.
 * Every in-flight packet has a retransmission timer that doubles up to a cap;
 * results of packets not in flight count as duplicates. Before its timer, a
 * packet goes again on evidence (RACK): a RESULT for a packet that went out
 * more than a quarter of the smoothed round trip after it (docs/transport.md,
 * "Loss by evidence").
 * New packets go in order of p, at most the congestion window's limit in
 * flight, paced (window.h: the rules of switchml_xdp/client/window.py), no
 * faster than the rate the box's last authentic RESULT stamped in `pace`,
 * with the DSCP of its IPv4 TOS; every DATA packet's `pace` says the call's
 * payload bytes not yet sent once, its own included (docs/transport.md, "The
 * box's rate").
 *
 * No Python here: the caller releases the GIL around swml_stream_run().
 */
#ifndef SWML_STREAM_H
#define SWML_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "packet.h"
#include "window.h"
#include "port.h"

enum swml_status {
	SWML_OK = 0,
	SWML_ABORTED = 1, /* the abort flag was raised */
	SWML_STALLED = 2, /* no result for stall_ns */
	SWML_ENOMEM = 3,
	SWML_EIO = 4,      /* the socket failed (sendto: a hard error) */
	SWML_E2BIG = 5,    /* more packets than SWML_SEQ_RESYNC_STRIDE: nothing sent */
	SWML_DISAGREE = 6, /* a RESULT of this call says the ranks' calls differ */
};

enum swml_dtype { SWML_INT32 = 0, SWML_FLOAT32 = 1 };

/* The call, as every rank describes it alike (switchml_xdp/client/calls.py). */
struct swml_call {
	uint8_t op;   /* SWML_OP_* */
	uint8_t fmt;  /* SWML_FMT_*: SWML_FMT_INT16 only for a float32 SUM */
	uint32_t tag; /* calls.call_tag: covers the precision, so fmt too */
	/* elements per rank's shard (reduce_scatter: rank r keeps [r*shard,
	 * (r+1)*shard)); 0: none, every rank keeps the whole result */
	uint64_t shard;
};

struct swml_stream_cfg {
	uint16_t job, rank;
	uint32_t world, k, slots;
	/* The job's lanes (a power of two dividing slots; 1: none) and this
	 * stream's: it sends packets i = lane mod lanes of the job's stream, so
	 * slots s = lane mod lanes, from its own port (docs/performance.md,
	 * "Several queues per worker"). Each lane is a stream of its own, with
	 * its own timers, window and share of the box's rate; a float32 SUM's
	 * lag is a multiple of lanes, so nothing a packet waits for is in
	 * another lane. */
	uint32_t lanes, lane;
	uint64_t key; /* the job's data key: every DATA packet carries it */
	/* RESULTs count only with the authenticator this key gives (packet.h,
	 * swml_result_authentic): SipHash's k0, k1 and SWML_AUTH_*. */
	uint64_t result_key[2];
	uint32_t auth;
	uint32_t seq_base; /* the wire seq of the job's packet 0 */
	struct swml_addrs addrs;
	/* Retransmission timeout, the rules of switchml_xdp/client/retransmit.py:
	 * rto_init_ns until the first RTT sample, then srtt + 4 rttvar (RFC 6298,
	 * Karn: no samples from resent packets) within [rto_min_ns, rto_max_ns];
	 * each expiry doubles a slot's timeout up to rto_max_ns, and that
	 * backed-off timeout holds for new packets until a fresh sample.
	 * rto_adaptive == 0: no samples, no carry-over; every packet starts at
	 * rto_init_ns. */
	uint64_t rto_init_ns, rto_min_ns, rto_max_ns, stall_ns;
	uint8_t rto_adaptive;
	struct swml_window_policy window;
	uint32_t spin;     /* empty polls of the rx ring before sleeping in ppoll */
	uint32_t coalesce; /* RESULTs a timed sleep gathers (engine_policy.h); 0: off */
	const volatile uint32_t *abort; /* nonzero: stop (set by another thread) */
	int wake_fd; /* readable once the abort flag is set: sleeps end at once (an
		      * eventfd; -1: none, the flag is read every SLEEP_MAX_NS) */
};

struct swml_stream_stats {
	uint64_t packets_sent, retransmissions, results, duplicates, shadow_replies;
	uint64_t ignored;     /* frames that were not a RESULT of this call from the switch */
	uint64_t forged;      /* RESULTs whose authenticator was wrong: not the switch's */
	uint64_t tx_deferred; /* sends that waited for a tx frame or ring slot */
	uint64_t sleeps;      /* ppoll calls */
	uint64_t coalesced;   /* timed sleeps that let RESULTs gather (stream.c, waiting) */
	uint64_t rtt_samples;
	uint64_t tensors;
	uint64_t window_waits;      /* ready packets that waited for room in the window */
	uint64_t pace_waits;        /* ready packets that waited for their paced send time */
	uint64_t spurious_timeouts; /* probes whose original was in the round after all */
	uint64_t header_only;       /* header-only RESULTs taken: another rank's shard */
	uint64_t rate_waits;        /* of the pace_waits, those the box's rate cap set */
	uint64_t rack_resends;      /* resent on evidence: a later packet's round came back */
	uint64_t tail_probes;       /* resent as the tail probe: no RESULT for 2 srtt */
	uint64_t timeout_copies;    /* extra copies of probes whose timer ran out again */
	uint64_t reorder_seen;      /* resends on evidence whose original was only late */
};

#define SWML_MAX_PENDING_REPORT 8

struct swml_stream {
	struct swml_stream_cfg cfg;
	struct swml_port *port;
	uint8_t tmpl[SWML_FMT_NUM][SWML_L2L4_LEN]; /* per payload format: the lengths differ */
	uint64_t next_index;                       /* packets of the job's life so far */
	struct swml_stream_stats stats;
	/* per slot, for the packet in flight there */
	int64_t *inflight;    /* packet index p in the current tensor, -1 if none */
	uint64_t *deadline;   /* when to resend; UINT64_MAX while queued for tx */
	uint64_t *rto;        /* its current timeout */
	uint64_t *sent_at;    /* first transmission, for an RTT sample */
	uint64_t *xmit_at;    /* latest transmission, for loss by evidence (RACK) */
	uint8_t *evidence_n;  /* resends on evidence so far */
	uint8_t *expiries;    /* its timer's expiries so far (copies, check_timers) */
	uint8_t *resent;      /* retransmitted: no RTT sample (Karn) */
	uint8_t *timer_state; /* TIMER_*: deferred behind the probe or not */
	int64_t probe;        /* the slot of the probe (retransmit.py), -1 if none */
	/* the RTT estimator and the congestion window, kept across tensors */
	uint64_t srtt_ns, rttvar_ns, rto_ns;
	struct swml_window win;
	/* RACK's margin, reo_mult quarters of the smoothed round trip, and the
	 * sample it is judged on (engine_policy.h, SWML_RACK_REO_SAMPLE): the
	 * packets resent on evidence answered, and answered twice */
	uint32_t reo_mult, reo_answered, reo_twice;
	/* what the box's last authentic RESULT said (docs/transport.md, "The
	 * box's rate"): its pace code, the rate in kbit/s (0: no cap), the DSCP
	 * our DATA to it carries from then on */
	uint16_t pace_code;
	uint8_t dscp;
	uint64_t rate_kbps;
	uint32_t n_inflight; /* slots with a packet in flight */
	uint8_t *queued;     /* 0, or QUEUED_NEW / QUEUED_RETRANS: waits for a tx frame */
	uint32_t n_queued, queue_cursor;
	/* after a failure: slots that were waiting */
	uint32_t pending[SWML_MAX_PENDING_REPORT];
	uint32_t n_pending;
};

int swml_stream_init(struct swml_stream *st, const struct swml_stream_cfg *cfg,
		     struct swml_port *port);
void swml_stream_free(struct swml_stream *st);

/* Reduce n elements at data (int32 or float32) in place over the job with
 * call->op. Returns an swml_status. */
int swml_stream_run(struct swml_stream *st, void *data, size_t n, enum swml_dtype dtype,
		    const struct swml_call *call);

/* The packet count of such a call over a job with `lanes` lanes, every
 * lane's together (as plans.packets_needed). */
uint64_t swml_stream_packets(uint64_t n, uint32_t k, uint32_t slots, uint32_t lanes,
			     enum swml_dtype dtype, uint8_t op);

/* A quantized float32 SUM of `blocks` blocks: packet p carries block p - lag,
 * lag = min(slots, blocks rounded up to a multiple of lanes) (plans.py). */
uint64_t swml_stream_lag(uint64_t blocks, uint32_t slots, uint32_t lanes);

/* The owner byte of packet p of a call of n elements, k a packet, with
 * shard elements per rank over world ranks: 1 + the rank whose shard holds
 * every element of the block packet p carries, or 0 (no shard, a block that
 * straddles two shards or lies past the last rank's, or a quantized float32
 * SUM's first lag packets, which carry no block: packet p carries block
 * p - lag; lag 0 for the other codings). Its Python twin is
 * switchml_xdp/client/plans.py's shard_owners: keep the two the same. */
uint8_t swml_shard_owner(uint64_t p, uint64_t n, uint32_t k, uint64_t lag, uint64_t shard,
			 uint32_t world);

#endif /* SWML_STREAM_H */
