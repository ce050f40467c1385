/* SPDX-License-Identifier: MIT */
/*
 * window.h - the congestion window and pacing of a worker's stream.
 *
 * The rules, and why, are in switchml_xdp/client/window.py; this is the same
 * arithmetic on the same doubles (times in seconds), so that the udp backend
 * (Python) and the afxdp engine (C) behave alike: tests/unit/test_window.py replays
 * one trace through both and compares every value bit for bit. Keep the two
 * in step, operation for operation.
 */
#ifndef SWML_WINDOW_H
#define SWML_WINDOW_H

#include <stdint.h>

struct swml_window_policy {
	int enabled; /* 0: all the slots at once, no pacing (the old rule) */
	double initial, ai, beta, max_mdf, target_backlog, pace_burst, random_loss_md;
	double max_backlog, target_delay_s;
};

struct swml_window {
	struct swml_window_policy policy;
	uint32_t slots;
	double cwnd, srtt, base, backlog, target, last_decrease, next_send;
	double rate, frame_bits; /* the box's cap in bits/s (0: none), a DATA frame's bits */
};

void swml_window_init(struct swml_window *w, uint32_t slots,
		      const struct swml_window_policy *policy);
/* A result for a packet sent once, rtt seconds after it went out. */
void swml_window_ack(struct swml_window *w, double rtt, double now);
/* A packet was lost: its timer expired (timeout), or a later one's result came
 * back first (timeout 0). */
void swml_window_loss(struct swml_window *w, double now, int timeout);
/* Packets that may be in flight now. */
uint32_t swml_window_limit(const struct swml_window *w);
/* The box's cap: bits_per_s of frames of frame_bits each (0: no cap). */
void swml_window_set_rate(struct swml_window *w, double bits_per_s, double frame_bits);
/* The window's seconds between two paced sends (0: none yet or at all). */
double swml_window_window_gap(const struct swml_window *w);
/* The cap's seconds between two sends (0: no cap). */
double swml_window_rate_gap(const struct swml_window *w);
/* Seconds between two paced sends: the larger of the two (0: no pacing). */
double swml_window_gap(const struct swml_window *w);
/* The cap, not the window, sets the pace now. */
int swml_window_rate_bound(const struct swml_window *w);
/* A new packet went out at now. */
void swml_window_sent(struct swml_window *w, double now);

#endif /* SWML_WINDOW_H */
