/* SPDX-License-Identifier: MIT */
/* stream.c - see stream.h. One call streams one whole tensor; all state that
 * must outlive it (the packet counter, per-slot timers, statistics) is in
 * struct swml_stream, everything per tensor in struct plan. */
#define _GNU_SOURCE
#include "stream.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine_policy.h"
#include "quant.h"

#define RX_BATCH SWML_PORT_RX_BATCH
#define QUEUED_NEW 1
#define QUEUED_RETRANS 2
/* The abort flag is read at least this often: a sleep also ends when the
 * engine's wake fd (stream.h) turns readable, so this only bounds how late an
 * abort without a wake is seen. Each wake of an idle rank costs ~35 us. */
#define SLEEP_MAX_NS 50000000ull
#define SLEEP_TX_WAIT_NS 50000ull /* while waiting for tx frames or ring room */

enum { P_UNSENT = 0, P_SENT = 1, P_DONE = 2 };
/* With P_SENT or P_DONE: the packet went again on evidence (a second
 * RESULT of it then says the resend was for nothing: reorder_seen). */
#define P_EVIDENCE 0x10
#define P_MASK 0x0f
/* A timer's state (retransmit.py): deferred behind the probe, the packet
 * goes when its timer runs out again. */
enum { TIMER_NORMAL = 0, TIMER_DEFERRED = 1 };

/* How a plan's payloads are made: as int32 (as is, or a float32 through the
 * order-preserving map), or quantized with an agreed exponent (float32 sum),
 * to int32 or to int16 (the 16-bit format). The two quantized codings share
 * the exponent round and the lag: only the payload differs. */
enum coding { C_INT32 = 0, C_ORDERED = 1, C_QUANT = 2, C_QUANT16 = 3 };

struct plan {
	enum coding coding;
	struct swml_data_id id; /* the call's header fields */
	uint8_t *data;
	size_t n;
	uint32_t k, S;
	uint32_t frame_len; /* headers + k elements of the call's fmt */
	int L;
	uint64_t blocks, lag, N, base;
	uint64_t shard;      /* the call's (struct swml_call), 0: none */
	uint64_t block_lag;  /* packet p carries block p - block_lag */
	uint32_t seq0;       /* the wire seq of packet 0 */
	uint8_t *state;      /* [N] P_* */
	uint64_t next_new;   /* the first packet never sent: new packets go in order */
	uint32_t Q;          /* the job's lanes: this stream sends every Q-th packet */
	uint64_t pace_until; /* a ready packet waits for its paced send time until then */
	uint64_t waiting;    /* the packet last counted as waiting (UINT64_MAX: none) */
	int8_t *lexp;        /* [blocks] float32: local exponent of block b */
	uint8_t *lnf;        /* [blocks] float32: block b has a non-finite element */
	int8_t *gexp;        /* [blocks] float32: global exponent of block b */
	uint32_t offset;     /* SWML_FMT_OFFSET32: 2^(30-L), added to each quantized
			      element sent and world times taken off each sum (else 0) */
	/* loop state */
	uint64_t remaining, now, last_progress, next_check;
	/* loss by evidence (RACK): the latest transmission time of a packet
	 * whose RESULT came back, and whether it moved since the last look */
	uint64_t rack_xmit, rack_rtt;
	int rack_moved;
	int tail_armed;       /* the tail probe may go: a RESULT came since the last */
	uint64_t last_new;    /* when the last packet went out for the first time */
	uint64_t last_rx;     /* when a pass last brought RESULTs (0: none yet this call) */
	uint64_t rx_gap;      /* smoothed time between RESULTs, ns (0: not known) */
	uint64_t last_resend; /* when a packet last went out again (0: not this call) */
};

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t min_u64(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

static inline uint32_t slot_of(const struct plan *pl, uint64_t p)
{
	return (uint32_t)((pl->base + p) % pl->S);
}

static inline int quantized(const struct plan *pl)
{
	return pl->coding == C_QUANT || pl->coding == C_QUANT16;
}

uint8_t swml_shard_owner(uint64_t p, uint64_t n, uint32_t k, uint64_t lag, uint64_t shard,
			 uint32_t world)
{
	uint64_t b, start, end, first;

	if (!shard || p < lag)
		return 0;
	b = p - lag;
	start = b * k;
	if (start >= n)
		return 0;
	end = min_u64(start + k, n);
	first = start / shard;
	if (first != (end - 1) / shard || first >= world)
		return 0;
	return (uint8_t)(first + 1);
}

static inline uint8_t owner_of(const struct swml_stream *st, const struct plan *pl, uint64_t p)
{
	return swml_shard_owner(p, pl->n, pl->k, pl->block_lag, pl->shard, st->cfg.world);
}

static inline int ready(const struct plan *pl, uint64_t p)
{
	return (p < pl->S || (pl->state[p - pl->S] & P_MASK) == P_DONE) &&
	       (p < pl->lag || (pl->state[p - pl->lag] & P_MASK) == P_DONE);
}

int swml_stream_init(struct swml_stream *st, const struct swml_stream_cfg *cfg,
		     struct swml_port *port)
{
	uint32_t S = cfg->slots;

	memset(st, 0, sizeof *st);
	st->cfg = *cfg;
	if (!st->cfg.lanes) /* a cfg that does not say: one lane */
		st->cfg.lanes = 1;
	st->reo_mult = 1;
	st->port = port;
	for (uint8_t fmt = 0; fmt < SWML_FMT_NUM; fmt++)
		swml_build_template(st->tmpl[fmt], &cfg->addrs, cfg->k, fmt);
	st->inflight = malloc(S * sizeof *st->inflight);
	st->deadline = malloc(S * sizeof *st->deadline);
	st->rto = malloc(S * sizeof *st->rto);
	st->queued = calloc(S, 1);
	st->sent_at = calloc(S, sizeof *st->sent_at);
	st->xmit_at = calloc(S, sizeof *st->xmit_at);
	st->evidence_n = calloc(S, 1);
	st->expiries = calloc(S, 1);
	st->resent = calloc(S, 1);
	st->timer_state = calloc(S, 1);
	st->probe = -1;
	if (!st->inflight || !st->deadline || !st->rto || !st->queued || !st->sent_at ||
	    !st->xmit_at || !st->evidence_n || !st->expiries || !st->resent || !st->timer_state) {
		swml_stream_free(st);
		return -ENOMEM;
	}
	for (uint32_t s = 0; s < S; s++) {
		st->inflight[s] = -1;
		st->deadline[s] = UINT64_MAX;
		st->rto[s] = cfg->rto_init_ns;
	}
	st->rto_ns = cfg->rto_init_ns;
	swml_window_init(&st->win, S, &cfg->window);
	return 0;
}

void swml_stream_free(struct swml_stream *st)
{
	free(st->inflight);
	free(st->deadline);
	free(st->rto);
	free(st->queued);
	free(st->sent_at);
	free(st->xmit_at);
	free(st->evidence_n);
	free(st->expiries);
	free(st->resent);
	free(st->timer_state);
	st->sent_at = st->xmit_at = NULL;
	st->evidence_n = NULL;
	st->expiries = NULL;
	st->resent = NULL;
	st->timer_state = NULL;
	st->inflight = NULL;
	st->deadline = st->rto = NULL;
	st->queued = NULL;
}

/* What packet p's DATA says in `pace`: the call's payload bytes not yet sent
 * once, its own included; a resend counts itself on top of those
 * (docs/transport.md, "The box's rate"). */
static uint64_t bytes_left(const struct plan *pl, uint64_t p, int retrans)
{
	const uint64_t left = retrans ? pl->N - min_u64(pl->next_new, pl->N) + 1 : pl->N - p;

	return left * (pl->frame_len - SWML_HEADERS_LEN);
}

/* Write packet p (Ethernet to payload) at f. */
static void build(struct swml_stream *st, const struct plan *pl, uint64_t p, int retrans,
		  uint8_t *f)
{
	const uint32_t k = pl->k;
	const uint64_t i = pl->base + p;
	void *payload = f + SWML_HEADERS_LEN; /* 64-byte aligned, see xsk_port.h */
	uint8_t flags = ((i / pl->S) & 1) ? SWML_FLAG_SLOT_VER : 0;
	int8_t exp = 0;

	if (retrans)
		flags |= SWML_FLAG_RETRANS;
	memcpy(f, st->tmpl[pl->id.fmt], SWML_L2L4_LEN);
	if (pl->coding == C_INT32) {
		size_t off = (size_t)p * k, m = min_u64(k, pl->n - off);

		memcpy(payload, pl->data + off * 4, m * 4);
		if (m < k)
			memset((int32_t *)payload + m, 0, (k - m) * 4);
	} else if (pl->coding == C_ORDERED) {
		size_t off = (size_t)p * k;

		swml_ordered_block((const float *)pl->data + off, min_u64(k, pl->n - off), k,
				   pl->id.op, payload);
	} else {
		exp = p < pl->blocks ? pl->lexp[p] : SWML_EXP_MIN;
		if (p >= pl->lag) {
			uint64_t b = p - pl->lag;
			size_t off = (size_t)b * k, m = min_u64(k, pl->n - off);
			const float *x = (const float *)pl->data + off;
			/* below: cannot happen, the switch returns the max, ours included */
			int checked = pl->gexp[b] < pl->lexp[b];

			if (pl->coding == C_QUANT16 && !checked)
				swml_quantize16_block(x, m, k, pl->gexp[b], payload);
			else if (pl->coding == C_QUANT16)
				swml_quantize16_block_checked(x, m, k, pl->gexp[b], payload);
			else if (!checked) /* the offset in the same pass (0 for SWML_FMT_INT32) */
				swml_quantize_block_offset(x, m, k, pl->gexp[b], pl->L, pl->offset,
							   payload);
			else
				swml_quantize_block_checked(x, m, k, pl->gexp[b], pl->L, payload);
			if (pl->offset && checked)
				swml_offset_block(payload, k, pl->offset);
			if (pl->lnf[b])
				flags |= SWML_FLAG_NONFINITE;
		} else {
			memset(payload, 0, (size_t)k * swml_fmt_size(pl->id.fmt));
		}
	}
	swml_write_data_hdr(f + SWML_L2L4_LEN, &pl->id, flags, (uint16_t)(i % pl->S),
			    pl->seq0 + (uint32_t)p, exp, owner_of(st, pl, p),
			    swml_pace_encode(bytes_left(pl, p, retrans)));
}

/* A packet went onto the tx ring in slot s: start its timer. */
static void arm(struct swml_stream *st, struct plan *pl, uint32_t s, int retrans)
{
	st->deadline[s] = pl->now + st->rto[s];
	if (st->deadline[s] < pl->next_check)
		pl->next_check = st->deadline[s];
	st->xmit_at[s] = pl->now;
	st->stats.packets_sent++;
	if (retrans) {
		st->resent[s] = 1;
		st->stats.retransmissions++;
		pl->last_resend = pl->now;
	} else {
		st->sent_at[s] = pl->now;
	}
}

/* RFC 6298 with the clamps of struct swml_stream_cfg. */
static void rtt_sample(struct swml_stream *st, uint64_t rtt)
{
	uint64_t rto;

	if (!st->stats.rtt_samples) {
		st->srtt_ns = rtt;
		st->rttvar_ns = rtt / 2;
	} else {
		uint64_t err = st->srtt_ns > rtt ? st->srtt_ns - rtt : rtt - st->srtt_ns;

		st->rttvar_ns = (3 * st->rttvar_ns + err) / 4;
		st->srtt_ns = (7 * st->srtt_ns + rtt) / 8;
	}
	st->stats.rtt_samples++;
	rto = st->srtt_ns + 4 * st->rttvar_ns;
	st->rto_ns = rto < st->cfg.rto_min_ns   ? st->cfg.rto_min_ns
		     : rto > st->cfg.rto_max_ns ? st->cfg.rto_max_ns
						: rto;
}

/* Put packet p on the tx ring, or queue its slot until a frame is free. */
static void transmit(struct swml_stream *st, struct plan *pl, uint64_t p, int retrans)
{
	const uint32_t s = slot_of(pl, p);
	uint8_t *f = swml_port_tx_reserve(st->port, pl->frame_len);

	if (!f) {
		if (!st->queued[s]) {
			st->queued[s] = retrans ? QUEUED_RETRANS : QUEUED_NEW;
			st->n_queued++;
		}
		st->deadline[s] = UINT64_MAX;
		st->stats.tx_deferred++;
		return;
	}
	build(st, pl, p, retrans, f);
	arm(st, pl, s, retrans);
}

static void send_new(struct swml_stream *st, struct plan *pl, uint64_t p)
{
	const uint32_t s = slot_of(pl, p);

	pl->state[p] = P_SENT;
	if (quantized(pl) && p < pl->blocks) {
		size_t off = (size_t)p * pl->k;
		int nf;

		pl->lexp[p] = swml_block_exponent((const float *)pl->data + off,
						  min_u64(pl->k, pl->n - off), &nf);
		pl->lnf[p] = (uint8_t)nf;
	}
	st->inflight[s] = (int64_t)p;
	st->n_inflight++;
	pl->last_new = pl->now;
	swml_window_sent(&st->win, pl->now * 1e-9);
	st->rto[s] = st->rto_ns;
	st->resent[s] = 0;
	st->evidence_n[s] = 0;
	st->expiries[s] = 0;
	st->timer_state[s] = TIMER_NORMAL;
	transmit(st, pl, p, 0);
}

/* Slots queued for lack of a tx frame, in slot order from a rotating cursor. */
static void drain_queue(struct swml_stream *st, struct plan *pl)
{
	const uint32_t S = pl->S;

	for (uint32_t n = 0; n < S && st->n_queued; n++) {
		uint32_t s = st->queue_cursor;
		uint8_t *f;
		int retrans;

		if (!st->queued[s]) {
			st->queue_cursor = (s + 1) % S;
			continue;
		}
		f = swml_port_tx_reserve(st->port, pl->frame_len);
		if (!f)
			return;
		retrans = st->queued[s] == QUEUED_RETRANS;
		st->queued[s] = 0;
		st->n_queued--;
		build(st, pl, (uint64_t)st->inflight[s], retrans, f);
		arm(st, pl, s, retrans);
		st->queue_cursor = (s + 1) % S;
	}
}

/* The probe's RESULT (retransmit.py): a loss if our resend completed the
 * round or the answer is a SHADOW reply; then the deferred packets go at once.
 * Else the original was in the round all along: the timeout was spurious, and
 * the deferred wait a fresh timeout. */
static void probe_answered(struct swml_stream *st, struct plan *pl, const struct swml_result *r)
{
	const int lost = r->rank == st->cfg.rank || (r->flags & SWML_FLAG_SHADOW);

	st->probe = -1;
	for (uint32_t s = 0; s < pl->S; s++) {
		if (st->timer_state[s] != TIMER_DEFERRED)
			continue;
		if (!lost)
			st->timer_state[s] = TIMER_NORMAL;
		if (st->deadline[s] == UINT64_MAX)
			continue;
		/* lost: at once (still deferred: it goes when its timer runs out);
		 * else the late rank is back: a fresh timeout for its packets */
		st->deadline[s] = lost ? pl->now : pl->now + st->rto[s];
		pl->next_check = min_u64(pl->next_check, st->deadline[s]);
	}
	/* No RTT sample from a spurious one: its round trip includes the late
	 * rank's wait, maybe its recovery from a loss; with such samples every
	 * rank's RTO grows to cover the others', and theirs to cover its
	 * (measured: the RTO ran up to its 0.5 s cap at 1% loss, 8 workers). */
	if (!lost)
		st->stats.spurious_timeouts++;
}

/* The base round trip in ns: the smallest the window has seen (0: none yet). */
static uint64_t base_rtt_ns(const struct swml_stream *st)
{
	return (uint64_t)(st->win.base * 1e9);
}

/* RACK's margin: reo_mult quarters of the smoothed round trip, at most all
 * of it (engine_policy.h, SWML_RACK_REO_SAMPLE). */
static uint64_t reo_window(const struct swml_stream *st)
{
	return min_u64(st->srtt_ns * st->reo_mult / SWML_RACK_REORDER_DIV, st->srtt_ns);
}

/* A packet resent on evidence has its (first) RESULT. Every
 * SWML_RACK_REO_SAMPLE of them the margin is judged by how many were answered
 * twice (reorder_seen): most, it grows; few, it is a quarter again. */
static void reorder_judge(struct swml_stream *st)
{
	if (++st->reo_answered < SWML_RACK_REO_SAMPLE)
		return;
	if (4 * st->reo_twice >= 3 * SWML_RACK_REO_SAMPLE) {
		if (st->reo_mult < SWML_RACK_REORDER_DIV)
			st->reo_mult++;
	} else if (4 * st->reo_twice <= SWML_RACK_REO_SAMPLE) {
		st->reo_mult = 1;
	}
	st->reo_answered = st->reo_twice = 0;
}

/* A packet resent on evidence has a second RESULT: both its copies were
 * answered, so the resend was for nothing (RACK's DSACK, RFC 8985 6.2):
 * its original's RESULT was only late, or another rank's resend completed
 * the round first (engine_policy.h, SWML_RACK_REO_SAMPLE). */
static void reorder_seen(struct swml_stream *st)
{
	st->stats.reorder_seen++;
	st->reo_twice++;
}

/* Slot s's packet has its RESULT: its latest transmission is evidence about
 * every packet sent before it (retransmit.py, "Loss by evidence"). A RESULT
 * that came back sooner than the base round trip after a resend answers the
 * original, not the resend: its time says nothing (RACK's rule). */
static void rack_answered(struct swml_stream *st, struct plan *pl, uint32_t s)
{
	const uint64_t t = st->xmit_at[s];

	if (st->deadline[s] == UINT64_MAX) /* still queued: never went */
		return;
	if (st->resent[s] && pl->now - t < base_rtt_ns(st))
		return;
	if (t > pl->rack_xmit) {
		pl->rack_xmit = t;
		pl->rack_rtt = pl->now - t;
		pl->rack_moved = 1;
	}
}

/* Loss by evidence (retransmit.py has the reasoning): every packet in flight
 * that went out more than a quarter of the smoothed round trip before a packet
 * whose RESULT is back lost its DATA, another rank's or its RESULT. It goes
 * again now, with its timeout as it was: nothing timed out. Its n-th resend
 * on evidence waits until 2^n round trips (that RESULT's, or the smoothed one
 * where longer) have passed since the last: the round may wait for a rank
 * that has yet to resend its own lost packet (descheduled, or still to hear
 * of the loss), and each of our resends meanwhile is a duplicate. */
static void rack_detect(struct swml_stream *st, struct plan *pl)
{
	/* the round trip a resend waits out: the smoothed one, which holds the
	 * other ranks' usual lateness, where it is longer */
	const uint64_t rtt = pl->rack_rtt > st->srtt_ns ? pl->rack_rtt : st->srtt_ns;
	const uint64_t reo = reo_window(st);
	int lost = 0;

	pl->rack_moved = 0;
	for (uint32_t s = 0; s < pl->S; s++) {
		uint64_t wait;

		if (st->inflight[s] < 0 || st->deadline[s] == UINT64_MAX ||
		    st->xmit_at[s] + reo >= pl->rack_xmit)
			continue;
		wait = (rtt << min_u64(st->evidence_n[s], SWML_RACK_MAX_BACKOFF)) + reo;
		if (pl->now < st->xmit_at[s] + wait)
			continue;
		st->timer_state[s] = TIMER_NORMAL;
		if (st->evidence_n[s] < UINT8_MAX)
			st->evidence_n[s]++;
		transmit(st, pl, (uint64_t)st->inflight[s], 1);
		pl->state[st->inflight[s]] |= P_EVIDENCE;
		st->stats.rack_resends++;
		lost = 1;
	}
	if (lost)
		swml_window_loss(&st->win, pl->now * 1e-9, 0);
}

/* When the tail probe may go (UINT64_MAX: not now): two smoothed round trips,
 * at most the RTO, after the last RESULT or the last first send, while packets
 * are in flight and no new one waits for its paced send time (the call's
 * tail, or a window or slots held by lost rounds: nothing new will go whose
 * RESULT could be evidence). Not while the pacer holds one: a stream paced
 * slower than a packet every two round trips would probe between every two
 * RESULTs. */
static uint64_t tail_probe_at(const struct swml_stream *st, const struct plan *pl)
{
	uint64_t since;

	if (!pl->tail_armed || !st->n_inflight || !st->srtt_ns || pl->pace_until != UINT64_MAX)
		return UINT64_MAX;
	since = pl->last_progress > pl->last_new ? pl->last_progress : pl->last_new;
	return since + min_u64(2 * st->srtt_ns, st->rto_ns);
}

/* The tail probe (retransmit.py): the newest packet in flight goes again,
 * once until the next RESULT; its answer is evidence about the older ones. */
static void tail_probe(struct swml_stream *st, struct plan *pl)
{
	int64_t newest = -1;

	if (pl->now < tail_probe_at(st, pl))
		return;
	pl->tail_armed = 0;
	for (uint32_t s = 0; s < pl->S; s++)
		if (st->inflight[s] >= 0 && st->deadline[s] != UINT64_MAX &&
		    (newest < 0 || st->inflight[s] > st->inflight[newest]))
			newest = s;
	if (newest < 0)
		return;
	transmit(st, pl, (uint64_t)st->inflight[newest], 1);
	st->stats.tail_probes++;
}

/* A RESULT of this job from the switch: 0, or -1 if it ends the call as a
 * disagreement. */
static int on_result(struct swml_stream *st, struct plan *pl, const struct swml_result *r)
{
	const uint32_t k = pl->k;
	uint64_t p = (uint32_t)(r->seq - pl->seq0);
	uint32_t s;
	int header_only;

	if (p >= pl->N || r->slot != slot_of(pl, p)) { /* another call's, or not ours */
		st->stats.ignored++;
		return 0;
	}
	if ((pl->state[p] & P_MASK) != P_SENT) {
		st->stats.duplicates++;
		if (pl->state[p] & P_EVIDENCE) { /* both copies answered: see reorder_seen */
			pl->state[p] &= (uint8_t)~P_EVIDENCE;
			reorder_seen(st);
		}
		return 0;
	}
	if (r->flags & SWML_FLAG_DISAGREE) /* the round's tag and op are another rank's */
		return -1;
	if (r->tag != pl->id.tag || r->op != pl->id.op) {
		st->stats.ignored++;
		return 0;
	}
	/* Header-only: the round's payload went to its owner alone. Ours, or
	 * no owner: not for us (the retransmission gets the full shadow reply). */
	header_only = (r->flags & SWML_FLAG_HEADER_ONLY) != 0;
	if (header_only) {
		const uint8_t owner = owner_of(st, pl, p);

		if (!owner || owner == st->cfg.rank + 1) {
			st->stats.ignored++;
			return 0;
		}
		st->stats.header_only++;
	}
	s = slot_of(pl, p);
	if (r->flags & SWML_FLAG_SHADOW)
		st->stats.shadow_replies++;
	if ((int64_t)s == st->probe)
		probe_answered(st, pl, r);
	st->timer_state[s] = TIMER_NORMAL;
	rack_answered(st, pl, s);
	if (!st->resent[s] && st->deadline[s] != UINT64_MAX) { /* Karn: sent once, and sent */
		if (st->cfg.rto_adaptive)
			rtt_sample(st, pl->now - st->sent_at[s]);
		swml_window_ack(&st->win, (pl->now - st->sent_at[s]) * 1e-9, pl->now * 1e-9);
	}
	if (pl->state[p] & P_EVIDENCE)
		reorder_judge(st);
	pl->state[p] = P_DONE | (pl->state[p] & P_EVIDENCE);
	st->inflight[s] = -1;
	st->n_inflight--;
	st->deadline[s] = UINT64_MAX;
	if (st->queued[s]) {
		st->queued[s] = 0;
		st->n_queued--;
	}
	st->stats.results++;
	pl->remaining--;
	pl->last_progress = pl->now;
	pl->tail_armed = 1;

	if (header_only) {
		/* another rank's block: nothing to write, but later packets
		 * quantize their block with the exponent this one returned */
		if (quantized(pl) && p < pl->blocks)
			pl->gexp[p] = r->exp;
	} else if (pl->coding == C_INT32) {
		size_t off = (size_t)p * k;

		memcpy(pl->data + off * 4, r->payload, min_u64(k, pl->n - off) * 4);
	} else if (pl->coding == C_ORDERED) {
		size_t off = (size_t)p * k;

		swml_unordered_block(r->payload, min_u64(k, pl->n - off), (float *)pl->data + off);
	} else {
		if (p < pl->blocks)
			pl->gexp[p] = r->exp;
		if (p >= pl->lag) {
			uint64_t b = p - pl->lag;
			size_t off = (size_t)b * k;
			const int nf = r->flags & SWML_FLAG_NONFINITE;
			float *y = (float *)pl->data + off;

			/* Block b's input is no longer needed: packets b and b + lag,
			 * the only ones reading it, both have their results. The
			 * payload is read where it lies in the frame, the world's
			 * offsets taken off on the way (uint32 wraps). */
			if (pl->coding == C_QUANT16)
				swml_dequantize16_payload(r->payload, min_u64(k, pl->n - off),
							  pl->gexp[b], pl->L, nf, y);
			else
				swml_dequantize_payload(r->payload, min_u64(k, pl->n - off),
							pl->offset * st->cfg.world, pl->gexp[b],
							pl->L, nf, y);
		}
	}
	return 0;
}

/* New packets, in order, while the window has room and the pacing allows. */
static void pump(struct swml_stream *st, struct plan *pl)
{
	const uint32_t limit = swml_window_limit(&st->win);
	const double now = pl->now * 1e-9;

	pl->pace_until = UINT64_MAX;
	while (pl->next_new < pl->N && ready(pl, pl->next_new)) {
		/* pump runs on every pass of the loop: each waiting packet counts once */
		const int first = pl->waiting != pl->next_new;

		if (st->n_inflight >= limit) {
			st->stats.window_waits += first;
			pl->waiting = pl->next_new;
			return;
		}
		if (st->win.next_send > now) {
			pl->pace_until = (uint64_t)(st->win.next_send * 1e9) + 1;
			st->stats.pace_waits += first;
			st->stats.rate_waits += first && swml_window_rate_bound(&st->win);
			pl->waiting = pl->next_new;
			return;
		}
		send_new(st, pl, pl->next_new);
		pl->next_new += pl->Q;
	}
}

/* An authentic RESULT: the box's word on this rank's rate and the job's DSCP
 * (docs/transport.md, "The box's rate"). */
static void box_pace(struct swml_stream *st, const struct plan *pl, const struct swml_result *r)
{
	const uint8_t dscp = r->tos >> 2;

	if (r->pace != st->pace_code) {
		st->pace_code = r->pace;
		st->rate_kbps = swml_pace_decode(r->pace);
		/* the rank's rate, shared by its lanes */
		swml_window_set_rate(&st->win, st->rate_kbps * 1e3 / st->cfg.lanes,
				     8.0 * pl->frame_len);
	}
	if (dscp != st->dscp) {
		st->dscp = dscp;
		for (uint8_t fmt = 0; fmt < SWML_FMT_NUM; fmt++)
			swml_template_set_tos(st->tmpl[fmt], (uint8_t)(dscp << 2));
	}
}

/* Up to RX_BATCH frames from the port; *disagree set if one ends the call. */
static uint32_t rx_batch(struct swml_stream *st, struct plan *pl, int *disagree)
{
	const uint8_t *frames[RX_BATCH];
	uint32_t lens[RX_BATCH];
	const uint32_t n = swml_port_rx(st->port, frames, lens);

	for (uint32_t i = 0; i < n && !*disagree; i++) { /* after a DISAGREE: only hand back */
		struct swml_result r;

		if (swml_parse_result(frames[i], lens[i], &st->cfg.addrs, st->cfg.job, pl->k,
				      pl->id.fmt, &r) == 0) {
			if (!swml_result_authentic(frames[i], lens[i], &r, pl->k,
						   st->cfg.result_key, st->cfg.auth)) {
				st->stats.forged++;
				continue;
			}
			swml_port_result_seen(st->port);
			box_pace(st, pl, &r);
			if (on_result(st, pl, &r))
				*disagree = 1;
		} else {
			st->stats.ignored++;
		}
	}
	swml_port_rx_done(st->port);
	return n;
}

/* How many copies the n-th expiry of a packet's timer sends
 * (engine_policy.h, SWML_RTO_COPIES_MAX): 1, 2, 4, ... */
static uint32_t expiry_copies(uint32_t n)
{
	const uint32_t c = n > 8 ? 256 : 1u << (n ? n - 1 : 0);

	return c < SWML_RTO_COPIES_MAX ? c : SWML_RTO_COPIES_MAX;
}

/* Slot s's timer ran out: its packet goes again; the probe as copies if its
 * timer ran out before (its resend was lost too). Only the probe: while it
 * is out the others wait (deferred), and a late rank's stall would have
 * every packet in flight resent as copies. */
static void resend_expired(struct swml_stream *st, struct plan *pl, uint32_t s)
{
	uint32_t copies, c;

	if (st->expiries[s] < UINT8_MAX)
		st->expiries[s]++;
	copies = (int64_t)s == st->probe ? expiry_copies(st->expiries[s]) : 1;
	/* a copy that finds no tx frame waits queued, once: the rest are not sent */
	for (c = 0; c < copies && !st->queued[s]; c++)
		transmit(st, pl, (uint64_t)st->inflight[s], 1);
	st->stats.timeout_copies += c ? c - 1 : 0;
}

/* Expired timers, by the rules of switchml_xdp/client/retransmit.py. While
 * RESULTs flow, every packet whose timer ran out goes again. When they have
 * stopped, the oldest goes as the probe (or the probe again), and so do those
 * deferred before (a loss the probe found makes them due at once); the others
 * are deferred once: re-armed for their timeout, not resent. */
static void check_timers(struct swml_stream *st, struct plan *pl)
{
	uint64_t next = UINT64_MAX;
	int lost = 0;

	if (st->probe < 0) {
		/* Stalled (no RESULT since the oldest due packet went out, or
		 * for the RTO / SWML_RTO_QUIET_DIV, far longer than RESULTs are
		 * apart while they flow: a rank is late): that packet becomes the
		 * probe. Else RESULTs flow, a timeout means a loss, and every due
		 * packet goes now. */
		int64_t oldest = -1;

		for (uint32_t s = 0; s < pl->S; s++)
			if (st->inflight[s] >= 0 && st->deadline[s] <= pl->now &&
			    st->timer_state[s] == TIMER_NORMAL &&
			    (oldest < 0 || st->inflight[s] < st->inflight[oldest]))
				oldest = s;
		if (oldest >= 0 && (st->sent_at[oldest] >= pl->last_progress ||
				    pl->now - pl->last_progress >= st->rto_ns / SWML_RTO_QUIET_DIV))
			st->probe = oldest;
	}
	for (uint32_t s = 0; s < pl->S; s++) {
		if (st->inflight[s] < 0 || st->deadline[s] == UINT64_MAX)
			continue;
		if (st->deadline[s] <= pl->now && st->probe >= 0 && (int64_t)s != st->probe &&
		    st->timer_state[s] == TIMER_NORMAL) { /* deferred once, never twice */
			st->deadline[s] = pl->now + st->rto[s];
			st->timer_state[s] = TIMER_DEFERRED;
		} else if (st->deadline[s] <= pl->now) {
			st->timer_state[s] = TIMER_NORMAL;
			st->rto[s] = min_u64(st->rto[s] * SWML_RTO_BACKOFF, st->cfg.rto_max_ns);
			/* RFC 6298 (5.5, 5.7): the backed-off timeout also holds for
			 * packets sent from now on, until a fresh RTT sample. Without
			 * this the estimator is censored: behind a deep queue (a
			 * shaped link holds the whole window) every packet slower
			 * than the current RTO is retransmitted and, by Karn's rule,
			 * never sampled, so srtt only sees the fast ones, the RTO
			 * stays below the real RTT and the retransmissions (which
			 * deepen the queue) never stop. */
			if (st->cfg.rto_adaptive && st->rto[s] > st->rto_ns)
				st->rto_ns = st->rto[s];
			resend_expired(st, pl, s);
			lost = 1;
		}
		next = min_u64(next, st->deadline[s]);
	}
	if (lost)
		swml_window_loss(&st->win, pl->now * 1e-9, 1);
	pl->next_check = next;
}

/* Waiting (engine_policy.h, SWML_ENGINE_COALESCE). A pass that brought
 * `results` RESULTs times the gap between RESULTs since the last such pass,
 * smoothed by 1/8 as srtt is (a RESULT apart, not a pass: a batch gathered
 * by a timed sleep does not read as a slower link); an idle spell (a late
 * rank) counts as at most the RTO floor. */
static void time_results(struct swml_stream *st, struct plan *pl, uint64_t results)
{
	if (pl->last_rx) {
		const uint64_t gap = min_u64(pl->now - pl->last_rx, st->cfg.rto_min_ns) / results;

		pl->rx_gap = pl->rx_gap ? (7 * pl->rx_gap + gap) / 8 : gap;
	}
	pl->last_rx = pl->now;
}

/* Empty passes of the rx ring before sleeping: the configured spin, unless
 * RESULTs come too far apart for spinning to catch the next one cheaper
 * than a wake does. */
static uint32_t spin_budget(const struct swml_stream *st, const struct plan *pl)
{
	return pl->rx_gap > SWML_SPIN_MAX_GAP_NS ? 0 : st->cfg.spin;
}

/* How long to sleep deaf to the socket so that RESULTs gather (0: do not).
 * Only in mid-stream: packets left to send, many in flight (the next
 * RESULTs are on their way, not the call's last), and RESULTs coming slower
 * than the engine takes them. (Requiring a full window as well batched
 * half the RESULTs: 52 against 44 s/GiB, N=2 at 200 Mbit/s, a run each.) */
static uint64_t coalesce_ns(const struct swml_stream *st, const struct plan *pl)
{
	const uint32_t n = st->cfg.coalesce;

	if (!n || !st->srtt_ns || pl->rx_gap < SWML_COALESCE_MIN_GAP_NS || st->n_inflight < 2 * n ||
	    pl->next_new >= pl->N)
		return 0;
	return min_u64(n * pl->rx_gap, st->srtt_ns / SWML_COALESCE_RTT_DIV);
}

/* How late the next paced send may go without the pacer losing its rate:
 * until its time plus the burst credit (window.c, swml_window_sent: a late
 * loop sends up to pace_burst packets at once). A coalescing sleep that ends
 * within it sends what the pacer let go meanwhile in one kick, instead of
 * waking at each packet's time (on a queue the ranks' own sends go through,
 * the pace wakes were most of a call's wakes: 2 ranks at 200 Mbit/s, their
 * CPU a GiB fell by a fifth). Not while losses are being repaired (a resend
 * in the last two round trips): there the pace wakes are also when the
 * RESULTs that show the next hole get read, and a call at 5% loss took 15%
 * longer without them. */
static uint64_t pace_slack_ns(const struct swml_stream *st, const struct plan *pl)
{
	const uint64_t until = pl->pace_until > pl->now ? pl->pace_until - pl->now : 0;

	if (pl->pace_until == UINT64_MAX)
		return UINT64_MAX;
	if (pl->last_resend && pl->now - pl->last_resend < 2 * st->srtt_ns)
		return until;
	return until +
	       (uint64_t)((st->win.policy.pace_burst - 1) * swml_window_gap(&st->win) * 1e9);
}

/* Wait for a frame (or a timer, or the abort check) without burning the CPU. */
static void sleep_rx(struct swml_stream *st, struct plan *pl, int *woken)
{
	uint64_t t = SLEEP_MAX_NS, probe_at, c;
	/* the wake fd (stream.h) where there is one, then the socket, and
	 * under an AF_XDP socket the UDP socket that strays reach (port.h) */
	struct pollfd pfd[3] = {{.fd = st->cfg.wake_fd, .events = POLLIN},
				{.fd = swml_port_fd(st->port), .events = POLLIN},
				{.fd = swml_port_stray_fd(st->port), .events = POLLIN}};
	const nfds_t wake = st->cfg.wake_fd >= 0;
	const nfds_t socks = pfd[2].fd >= 0 ? 2 : 1;
	struct pollfd *from = wake ? pfd : &pfd[1];
	struct timespec ts;

	if (pl->next_check > pl->now)
		t = min_u64(t, pl->next_check - pl->now);
	else
		t = 0;
	if (st->n_queued || swml_port_tx_pending(st->port))
		t = min_u64(t, SLEEP_TX_WAIT_NS);
	if (pl->last_progress + st->cfg.stall_ns > pl->now)
		t = min_u64(t, pl->last_progress + st->cfg.stall_ns - pl->now);
	probe_at = tail_probe_at(st, pl);
	if (probe_at != UINT64_MAX)
		t = probe_at > pl->now ? min_u64(t, probe_at - pl->now) : 0;
	c = coalesce_ns(st, pl);
	if (c && c < t && c <= pace_slack_ns(st, pl)) {
		/* A timed sleep the arrivals do not cut short: their wake-ups
		 * are what it saves (one a batch, not one a RESULT). */
		ts.tv_sec = 0;
		ts.tv_nsec = (long)c;
		st->stats.coalesced++;
		ppoll(pfd, wake, &ts, NULL);
		*woken = 1;
		return;
	}
	if (pl->pace_until != UINT64_MAX)
		t = pl->pace_until > pl->now ? min_u64(t, pl->pace_until - pl->now) : 0;
	ts.tv_sec = t / 1000000000ull;
	ts.tv_nsec = t % 1000000000ull;
	st->stats.sleeps++;
	*woken = 0;
	if (ppoll(from, wake + socks, &ts, NULL) <= 0)
		return;
	if (socks == 2 && (pfd[2].revents & POLLIN))
		swml_port_arm_strays(st->port);
	*woken = (pfd[1].revents | pfd[2].revents) & POLLIN;
}

static void flush_tx(struct swml_stream *st, int *io_error)
{
	swml_port_submit(st->port);
	if (swml_port_tx_pending(st->port) && swml_port_kick(st->port) < 0)
		*io_error = 1;
}

uint64_t swml_stream_lag(uint64_t blocks, uint32_t slots, uint32_t lanes)
{
	return min_u64(slots, (blocks + lanes - 1) / lanes * lanes);
}

uint64_t swml_stream_packets(uint64_t n, uint32_t k, uint32_t slots, uint32_t lanes,
			     enum swml_dtype dtype, uint8_t op)
{
	uint64_t blocks = (n + k - 1) / k;

	if (dtype == SWML_FLOAT32 && op == SWML_OP_SUM)
		return blocks + swml_stream_lag(blocks, slots, lanes);
	return blocks;
}

/* Where the stream goes on after a failed call that started at `start`
 * (switchml_xdp/client/calls.py: resync_index). */
static uint64_t resync_index(uint64_t start, uint32_t S)
{
	uint64_t period = 2ull * S, end = start + SWML_SEQ_RESYNC_STRIDE;

	return (end + period - 1) / period * period;
}

int swml_stream_run(struct swml_stream *st, void *data, size_t n, enum swml_dtype dtype,
		    const struct swml_call *call)
{
	struct plan pl = {0};
	const uint32_t S = st->cfg.slots, k = st->cfg.k, Q = st->cfg.lanes;
	uint32_t idle = 0;
	int status = SWML_OK, io_error = 0, disagree = 0;
	/* Paced sends sleep for tens of microseconds: the default 50 us timer
	 * slack would round each such sleep up to twice as long. */
	int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);

	st->n_pending = 0;
	if (n == 0)
		return SWML_OK;
	if (st->cfg.wake_fd >= 0) {
		/* a wake left from an earlier call's abort: the flag says whether
		 * this one is aborted too, and a readable fd would end every sleep */
		uint64_t stale;

		if (read(st->cfg.wake_fd, &stale, sizeof stale) < 0 && errno != EAGAIN)
			return SWML_EIO;
	}
	pl.coding = dtype == SWML_INT32           ? C_INT32
		    : call->op != SWML_OP_SUM     ? C_ORDERED
		    : call->fmt == SWML_FMT_INT16 ? C_QUANT16
						  : C_QUANT;
	pl.id = (struct swml_data_id){.job = st->cfg.job,
				      .rank = st->cfg.rank,
				      .count = (uint16_t)k,
				      .op = call->op,
				      .fmt = call->fmt,
				      .tag = call->tag,
				      .key = st->cfg.key};
	pl.frame_len = SWML_HEADERS_LEN + swml_fmt_size(call->fmt) * k;
	/* the box's cap holds, in frames of this call's size */
	swml_window_set_rate(&st->win, st->win.rate, 8.0 * pl.frame_len);
	pl.data = data;
	pl.n = n;
	pl.k = k;
	pl.S = S;
	pl.L = swml_exponent_bits(st->cfg.world);
	if (pl.coding == C_QUANT && call->fmt == SWML_FMT_OFFSET32)
		pl.offset = 1u << (30 - pl.L);
	pl.blocks = (n + k - 1) / k;
	pl.shard = call->shard;
	pl.N = swml_stream_packets(n, k, S, Q, dtype, call->op);
	if (pl.N > SWML_SEQ_RESYNC_STRIDE)
		return SWML_E2BIG; /* refused before anything is sent: the stream stays */
	if (quantized(&pl)) {
		pl.lag = pl.block_lag = swml_stream_lag(pl.blocks, S, Q);
		pl.lexp = malloc(pl.blocks);
		pl.lnf = malloc(pl.blocks);
		pl.gexp = malloc(pl.blocks);
	} else {
		pl.lag = S;
	}
	pl.base = st->next_index;
	pl.seq0 = st->cfg.seq_base + (uint32_t)pl.base;
	pl.state = calloc(pl.N, 1);
	if (!pl.state || (quantized(&pl) && (!pl.lexp || !pl.lnf || !pl.gexp))) {
		status = SWML_ENOMEM;
		goto out;
	}
	/* This lane's packets: p with base + p = lane mod Q, from the first. */
	pl.Q = Q;
	pl.next_new = (st->cfg.lane + Q - pl.base % Q) % Q;
	pl.remaining = pl.N > pl.next_new ? (pl.N - pl.next_new + Q - 1) / Q : 0;
	pl.now = pl.last_progress = now_ns();
	pl.next_check = UINT64_MAX;
	pl.waiting = UINT64_MAX;
	pl.tail_armed = 1;
	if (slack > 1000)
		prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0);

	pump(st, &pl);
	flush_tx(st, &io_error);

	while (pl.remaining && !io_error && !disagree) {
		uint32_t got;
		uint64_t results;

		if (st->cfg.abort && __atomic_load_n(st->cfg.abort, __ATOMIC_RELAXED)) {
			status = SWML_ABORTED;
			break;
		}
		pl.now = now_ns();
		results = st->stats.results;
		got = rx_batch(st, &pl, &disagree);
		if (st->stats.results != results)
			time_results(st, &pl, st->stats.results - results);
		if (disagree) {
			status = SWML_DISAGREE;
			break;
		}
		if (pl.rack_moved)
			rack_detect(st, &pl);
		if (st->n_queued) {
			swml_port_reclaim(st->port);
			drain_queue(st, &pl);
		}
		pump(st, &pl);
		/* Timers only with the rx ring drained: after a pause (this thread
		 * descheduled) the results are usually waiting there already. */
		if (got < RX_BATCH) {
			tail_probe(st, &pl);
			if (pl.now >= pl.next_check)
				check_timers(st, &pl);
		}
		flush_tx(st, &io_error);
		if (swml_port_tx_low(st->port))
			swml_port_reclaim(st->port);
		/* Also while frames keep coming: frames that are not results (a
		 * flood of them) must not hold off the stall clock. */
		if (pl.now - pl.last_progress > st->cfg.stall_ns) {
			status = SWML_STALLED;
			break;
		}
		if (got) {
			idle = 0;
			continue;
		}
		if (++idle > spin_budget(st, &pl)) {
			int woken;

			sleep_rx(st, &pl, &woken);
			idle = woken ? 0 : st->cfg.spin;
		}
	}
	if (io_error && status == SWML_OK)
		status = SWML_EIO;
	flush_tx(st, &io_error);

out:
	for (uint32_t s = 0; s < S; s++) {
		if (st->inflight[s] >= 0 && st->n_pending < SWML_MAX_PENDING_REPORT)
			st->pending[st->n_pending++] = s;
		st->inflight[s] = -1;
		st->deadline[s] = UINT64_MAX;
		st->queued[s] = 0;
		st->timer_state[s] = TIMER_NORMAL;
	}
	st->probe = -1;
	st->n_queued = 0;
	st->n_inflight = 0;
	if (slack > 1000)
		prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
	if (status == SWML_OK) {
		st->next_index += pl.N;
		st->stats.tensors++;
	} else if (status != SWML_ENOMEM) {
		/* Every rank that failed this call goes on from the same packet,
		 * past anything the call sent: the job stays usable. */
		st->next_index = resync_index(pl.base, S);
	}
	free(pl.state);
	free(pl.lexp);
	free(pl.lnf);
	free(pl.gexp);
	return status;
}
