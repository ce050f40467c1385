/* SPDX-License-Identifier: MIT */
/* window.c - see window.h; the rules are switchml_xdp/client/window.py's. */
#include "window.h"

static double clamp_cwnd(double cwnd, uint32_t slots)
{
	if (cwnd > (double)slots)
		cwnd = (double)slots;
	return cwnd < 1.0 ? 1.0 : cwnd;
}

void swml_window_init(struct swml_window *w, uint32_t slots,
		      const struct swml_window_policy *policy)
{
	w->policy = *policy;
	w->slots = slots;
	w->cwnd = clamp_cwnd(policy->initial, slots);
	w->srtt = w->base = w->backlog = 0.0;
	w->target = policy->target_backlog;
	w->last_decrease = -1e300;
	w->next_send = 0.0;
	w->rate = w->frame_bits = 0.0;
}

void swml_window_set_rate(struct swml_window *w, double bits_per_s, double frame_bits)
{
	const int ok = bits_per_s > 0.0 && frame_bits > 0.0;

	w->rate = ok ? bits_per_s : 0.0;
	w->frame_bits = ok ? frame_bits : 0.0;
}

/* The window holds more than twice the cap's packets a round trip plus the
 * backlog allowed: no growth. */
static int capped(const struct swml_window *w)
{
	return w->rate > 0.0 && w->cwnd > 2.0 * w->rate * w->srtt / w->frame_bits + w->target;
}

static int may_decrease(const struct swml_window *w, double now)
{
	return w->srtt == 0.0 || now - w->last_decrease >= w->srtt;
}

void swml_window_ack(struct swml_window *w, double rtt, double now)
{
	const struct swml_window_policy *p = &w->policy;
	double backlog, target;

	if (w->base == 0.0 || rtt < w->base)
		w->base = rtt;
	w->srtt = w->srtt == 0.0 ? rtt : 0.875 * w->srtt + 0.125 * rtt;
	backlog = w->backlog = w->cwnd * (w->srtt - w->base) / w->srtt;
	target = p->target_delay_s * w->cwnd / w->srtt;
	if (target < p->target_backlog)
		target = p->target_backlog;
	if (target > p->max_backlog)
		target = p->max_backlog;
	w->target = target;
	if (backlog <= target) {
		if (!capped(w))
			w->cwnd += p->ai / w->cwnd;
	} else if (may_decrease(w, now)) {
		double f = p->beta * (backlog - target) / backlog;

		w->cwnd *= 1.0 - (f < p->max_mdf ? f : p->max_mdf);
		w->last_decrease = now;
	}
	w->cwnd = clamp_cwnd(w->cwnd, w->slots);
}

void swml_window_loss(struct swml_window *w, double now, int timeout)
{
	double md;

	if (w->backlog > w->target)
		md = 0.5;
	else if (timeout)
		md = w->policy.random_loss_md;
	else
		md = 0.0;
	if (md > 0.0 && may_decrease(w, now)) {
		w->cwnd *= 1.0 - md;
		w->last_decrease = now;
		w->cwnd = clamp_cwnd(w->cwnd, w->slots);
	}
}

uint32_t swml_window_limit(const struct swml_window *w)
{
	return w->policy.enabled ? (uint32_t)w->cwnd : w->slots;
}

double swml_window_window_gap(const struct swml_window *w)
{
	if (!w->policy.enabled || w->srtt == 0.0)
		return 0.0;
	return w->srtt / w->cwnd;
}

double swml_window_rate_gap(const struct swml_window *w)
{
	return w->rate > 0.0 ? w->frame_bits / w->rate : 0.0;
}

double swml_window_gap(const struct swml_window *w)
{
	const double g = swml_window_window_gap(w), r = swml_window_rate_gap(w);

	return r > g ? r : g;
}

int swml_window_rate_bound(const struct swml_window *w)
{
	return swml_window_rate_gap(w) > swml_window_window_gap(w);
}

void swml_window_sent(struct swml_window *w, double now)
{
	double g = swml_window_gap(w), earliest = now - (w->policy.pace_burst - 1) * g;

	if (g == 0.0) {
		w->next_send = now;
		return;
	}
	w->next_send = (w->next_send > earliest ? w->next_send : earliest) + g;
}
