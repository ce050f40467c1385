/* SPDX-License-Identifier: MIT */
/*
 * swml_tcp_loss.c - random loss of IPv4 TCP segments on the lab's worker
 * links, for benchmarks of TCP peers (Gloo) under the same loss rates the lab's
 * loss injector (swml_loss.c) applies to swml's UDP. Loaded with bcc by
 * switchml_xdp/bench/tcp_loss.py.
 *
 * Two tc (clsact) programs on every worker's bridge-side end, filed before the
 * loss injector's own filters on the same hooks:
 *
 *   swml_tcp_loss_up    ingress: segments the worker sends
 *   swml_tcp_loss_down  egress:  segments the worker receives
 *
 * Each drops an IPv4 TCP frame with probability cfg[direction] / 2^32
 * (bpf_get_prandom_u32() below the threshold) and returns TC_ACT_UNSPEC for
 * every other frame, so that the next filter (the loss injector) still sees
 * it. The lab's veths do not aggregate (GRO is off on the bridge-side ends,
 * segmentation happens before the worker's own qdisc), so one frame is one
 * MSS-sized segment or one ACK, as on a wire.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/in.h>
#include <uapi/linux/pkt_cls.h>

#define SWML_TCP_LOSS_UP 0
#define SWML_TCP_LOSS_DOWN 1

BPF_ARRAY(cfg, u32, 2);             /* drop threshold per direction */
BPF_PERCPU_ARRAY(counters, u64, 4); /* [dir * 2] seen, [dir * 2 + 1] dropped */

static __always_inline int tcp_loss(struct __sk_buff *skb, u32 dir)
{
	u8 proto;
	u32 seen = dir * 2, dropped = dir * 2 + 1;

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_UNSPEC;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, protocol), &proto, 1) < 0 ||
	    proto != IPPROTO_TCP)
		return TC_ACT_UNSPEC;
	u32 *t = cfg.lookup(&dir);
	u64 *c = counters.lookup(&seen);
	if (c)
		*c += 1;
	if (t && *t && bpf_get_prandom_u32() < *t) {
		c = counters.lookup(&dropped);
		if (c)
			*c += 1;
		return TC_ACT_SHOT;
	}
	return TC_ACT_UNSPEC;
}

int swml_tcp_loss_up(struct __sk_buff *skb)
{
	return tcp_loss(skb, SWML_TCP_LOSS_UP);
}

int swml_tcp_loss_down(struct __sk_buff *skb)
{
	return tcp_loss(skb, SWML_TCP_LOSS_DOWN);
}
