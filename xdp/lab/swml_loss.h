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

struct swml_loss_cfg {
	__u32 drop; /* threshold: drop with probability drop / 2^32 */
	__u32 dup;  /* threshold: duplicate a passed frame with probability dup / 2^32 */
};

struct swml_loss_counters {
	__u64 seen; /* frames subject to loss (data-port UDP) */
	__u64 dropped;
	__u64 duplicated; /* extra copies sent */
	__u64 passed;     /* frames not dropped (their copies not included) */
};

#endif /* SWML_LOSS_H */
