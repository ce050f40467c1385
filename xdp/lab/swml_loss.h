/* SPDX-License-Identifier: MIT */
/*
 * swml_loss.h - the constants and map values of the lab's loss injector
 * (swml_loss.c), shared with switchml_xdp/lab/loss.py through the generated
 * layout (switchml_xdp/layout_gen.py).
 */
#ifndef SWML_LOSS_H
#define SWML_LOSS_H

#define SWML_LOSS_MAX_LINKS 256     /* hosts of a lab: switch + up to 244 workers */
#define SWML_LOSS_UP 0              /* direction: host -> bridge */
#define SWML_LOSS_DOWN 1            /* direction: bridge -> host */
#define SWML_LOSS_ALWAYS 0xffffffff /* threshold meaning probability 1 */
#define SWML_LOSS_MARK 0x534d4c44   /* skb->mark of a duplicate ("SMLD") */
#define SWML_LOSS_IP_OFFSET 0x1fff  /* fragment offset bits of iphdr.frag_off */

/* Thresholds: an event of probability P happens when a random u32 < P * 2^32.
 * Bursts (a Gilbert-Elliott model) are on when to_bad != 0: each subject frame
 * first moves the link between its good and bad state (good -> bad with
 * probability to_bad, bad -> good with to_good), then is dropped with `drop`
 * in the good state and `bad_drop` in the bad one. */
struct swml_loss_cfg {
	__u32 drop;     /* drop in the good state (the random loss) */
	__u32 dup;      /* duplicate a passed frame */
	__u32 to_bad;   /* p: good -> bad, a frame; 0 = no bursts */
	__u32 to_good;  /* r: bad -> good, a frame (mean stay in bad: 1/r frames) */
	__u32 bad_drop; /* h: drop in the bad state */
};

/* The model's state of one link and direction, shared by all CPUs. */
struct swml_loss_state {
	__u32 bad;          /* 1 while in the bad state */
	__u32 last_dropped; /* 1 if the last subject frame was dropped */
};

struct swml_loss_counters {
	__u64 seen; /* frames subject to loss (data-port UDP) */
	__u64 dropped;
	__u64 duplicated; /* extra copies sent */
	__u64 passed;     /* frames not dropped (their copies not included) */
	__u64 bad;        /* frames seen in the bad state */
	__u64 bursts;     /* good -> bad transitions */
	__u64 drop_runs;  /* runs of consecutive drops (a drop after a pass) */
};

#endif /* SWML_LOSS_H */
