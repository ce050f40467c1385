/* SPDX-License-Identifier: MIT */
/*
 * swml_loss.c - the lab's loss and duplication injector (loaded with bcc by
 * switchml_xdp/lab/loss.py, once per lab; this kernel has no sch_netem).
 *
 * Every lab link is a veth pair whose bridge-side end (Host.peer, in the
 * bridge namespace) sees both directions of that link:
 *
 *   up   = frames the host sends    -> the peer's XDP hook (ingress), then
 *                                      its tc ingress hook (after XDP_PASS)
 *   down = frames the host receives -> the peer's tc egress hook (the bridge
 *                                      forwards through the stack, so also the
 *                                      switch's XDP_TX'd RESULTs, after the
 *                                      bridge cloned them per port)
 *
 * Three programs, one object, shared maps:
 *
 *   swml_loss_xdp      XDP on the peer: drops "up" frames. It replaces the
 *                      lab's pass program (xdp/lab/swml_pass.c), which the peer
 *                      needs anyway for XDP_TX/AF_XDP traffic to arrive, and
 *                      passes everything else.
 *   swml_loss_ingress  tc (clsact) ingress on the peer: duplicates "up" frames
 *                      the XDP program passed. XDP cannot clone a frame
 *                      (XDP_TX would bounce it back to its sender, a devmap
 *                      broadcast cannot target the bridge), so duplication
 *                      is done on the skb with bpf_clone_redirect(BPF_F_INGRESS).
 *   swml_loss_egress   tc (clsact) egress on the peer: drops (TC_ACT_SHOT) and
 *                      duplicates (bpf_clone_redirect to the same egress)
 *                      "down" frames, per link even for multicast.
 *
 * The worker's own interface (Host.iface) is left alone: it may carry the
 * AF_XDP redirect program (xdp/swml_redirect.c), and a veth has one XDP program.
 *
 * Only swml data traffic is subject to loss: IPv4 UDP from or to the port in
 * loss_port[0] (the switch's data port, 48864 by default; 0 = every UDP
 * datagram). ARP, ICMP and the control protocol's TCP connection always pass
 * and are not counted: TCP would recover, but lease and join timing should not
 * depend on the injected loss. IP fragments after the first carry no UDP
 * header and are subject only when the port is 0.
 *
 * A probability P is a u32 threshold T = P * 2^32 (rounded, at most
 * 2^32 - 1); an event happens when bpf_get_prandom_u32() < T, and always when
 * T == SWML_LOSS_ALWAYS (P = 1). A frame is first dropped with probability
 * `drop`; a frame that passes is then duplicated (one extra copy) with
 * probability `dup`. So, per link and direction,
 *     seen = dropped + passed,  copies delivered = passed + duplicated.
 *
 * Bursts: with cfg.to_bad != 0 the link and direction follow a two-state
 * Gilbert-Elliott model. Every subject frame first moves it (good -> bad with
 * probability to_bad, bad -> good with to_good), then is dropped with
 * probability `drop` in the good state, `bad_drop` in the bad one. The state
 * lives in one shared entry (map `state`), read and written without a lock:
 * two CPUs handling the same link's frames at once may both step from the
 * same state, which blurs the model slightly (a burst a frame longer or
 * shorter), never breaks it. With to_bad == 0 the state is reset to good.
 * The counters `bad`, `bursts` and `drop_runs` let a user check the model:
 * bad / seen is the time in the bad state, bad / bursts the mean stay there,
 * dropped / drop_runs the mean run of consecutive drops.
 *
 * A duplicate re-enters the hook it was made in; it carries SWML_LOSS_MARK in
 * skb->mark so that it passes (uncounted, mark cleared) instead of looping.
 *
 * Maps (pinned under SWML_LOSS_PIN_DIR, so another process, e.g. one that
 * found the lab with Lab.from_state, reads and sets them without reloading):
 *   links     hash   ifindex of a peer (bridge namespace) -> link index
 *   cfg       array  link * 2 + direction -> struct swml_loss_cfg
 *   port      array  [0] = data port (host order), 0 = all UDP
 *   counters  percpu link * 2 + direction -> struct swml_loss_counters
 *   state     array  link * 2 + direction -> struct swml_loss_state
 *
 * Load-time define: SWML_LOSS_PIN_DIR, a string literal.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/in.h>
#include <uapi/linux/udp.h>
#include <uapi/linux/pkt_cls.h>

#ifndef SWML_LOSS_PIN_DIR
#error "SWML_LOSS_PIN_DIR must be defined"
#endif

#include "lab/swml_loss.h" /* by -I xdp/: bcc compiles the source as main.c */

BPF_TABLE_PINNED("hash", u32, u32, links, SWML_LOSS_MAX_LINKS, SWML_LOSS_PIN_DIR "/links");
BPF_TABLE_PINNED("array", u32, struct swml_loss_cfg, cfg, 2 * SWML_LOSS_MAX_LINKS,
		 SWML_LOSS_PIN_DIR "/cfg");
BPF_TABLE_PINNED("array", u32, u32, port, 1, SWML_LOSS_PIN_DIR "/port");
BPF_TABLE_PINNED("percpu_array", u32, struct swml_loss_counters, counters, 2 * SWML_LOSS_MAX_LINKS,
		 SWML_LOSS_PIN_DIR "/counters");
BPF_TABLE_PINNED("array", u32, struct swml_loss_state, state, 2 * SWML_LOSS_MAX_LINKS,
		 SWML_LOSS_PIN_DIR "/state");

static __always_inline int chance(__u32 threshold)
{
	if (threshold == 0)
		return 0;
	if (threshold == SWML_LOSS_ALWAYS)
		return 1;
	return bpf_get_prandom_u32() < threshold;
}

/* Is an IPv4 frame with this header subject to loss? `l4` holds the first
 * 4 bytes after the IP header (UDP source and destination port) when
 * `have_l4`. */
static __always_inline int subject(__u8 protocol, __be16 frag_off, int have_l4, __be16 sport,
				   __be16 dport)
{
	__u32 zero = 0;
	__u32 *p = port.lookup(&zero);
	__u32 want = p ? *p : 0;

	if (protocol != IPPROTO_UDP)
		return 0;
	if (want == 0)
		return 1;
	if (frag_off & bpf_htons(SWML_LOSS_IP_OFFSET))
		return 0; /* a later fragment: no ports to match */
	if (!have_l4)
		return 0;
	return sport == bpf_htons(want) || dport == bpf_htons(want);
}

static __always_inline int skb_subject(struct __sk_buff *skb)
{
	struct iphdr ip;
	struct udphdr udp = {};
	int have_l4;

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return 0;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
		return 0;
	if (ip.ihl < 5)
		return 0;
	have_l4 = bpf_skb_load_bytes(skb, ETH_HLEN + ip.ihl * 4, &udp, sizeof(udp)) == 0;
	return subject(ip.protocol, ip.frag_off, have_l4, udp.source, udp.dest);
}

/* One link and direction: its configuration, counters and model state. */
struct swml_loss_link {
	struct swml_loss_cfg *cfg;
	struct swml_loss_counters *n;
	struct swml_loss_state *st;
};

/* Fill *l for (this interface, direction); 0 if the interface is not one of
 * the lab's links. */
static __always_inline int lookup(__u32 ifindex, __u32 dir, struct swml_loss_link *l)
{
	__u32 *link = links.lookup(&ifindex);
	__u32 idx;

	if (!link || *link >= SWML_LOSS_MAX_LINKS)
		return 0;
	idx = *link * 2 + dir;
	l->cfg = cfg.lookup(&idx);
	l->n = counters.lookup(&idx);
	l->st = state.lookup(&idx);
	return l->cfg && l->n && l->st;
}

/* Send one extra copy of skb through the hook it is in (flags 0 = egress,
 * BPF_F_INGRESS = ingress). The copy is marked so that it is passed, not
 * treated again, when it comes back through this program. */
static __always_inline void duplicate(struct __sk_buff *skb, __u64 flags,
				      struct swml_loss_counters *n)
{
	__u32 mark = skb->mark;

	skb->mark = SWML_LOSS_MARK;
	if (bpf_clone_redirect(skb, skb->ifindex, flags) == 0)
		__sync_fetch_and_add(&n->duplicated, 1);
	skb->mark = mark;
}

/* Step the link's burst model for one frame; the drop threshold of the
 * state the frame is in. */
static __always_inline __u32 drop_threshold(struct swml_loss_link *l)
{
	struct swml_loss_cfg *c = l->cfg;
	struct swml_loss_state *st = l->st;
	__u32 bad = st->bad;

	if (c->to_bad == 0) {
		if (bad)
			st->bad = 0;
		return c->drop;
	}
	if (bad ? chance(c->to_good) : chance(c->to_bad)) {
		bad = !bad;
		st->bad = bad;
		if (bad)
			__sync_fetch_and_add(&l->n->bursts, 1);
	}
	if (!bad)
		return c->drop;
	__sync_fetch_and_add(&l->n->bad, 1);
	return c->bad_drop;
}

/* Count a subject frame as seen, then as dropped (with the probability of
 * the model's state) or passed; 1 if it is to be dropped. */
static __always_inline int drop_one(struct swml_loss_link *l)
{
	struct swml_loss_counters *n = l->n;
	int drop = chance(drop_threshold(l));

	__sync_fetch_and_add(&n->seen, 1);
	if (drop && !l->st->last_dropped)
		__sync_fetch_and_add(&n->drop_runs, 1);
	if (l->st->last_dropped != drop)
		l->st->last_dropped = drop;
	if (drop) {
		__sync_fetch_and_add(&n->dropped, 1);
		return 1;
	}
	__sync_fetch_and_add(&n->passed, 1);
	return 0;
}

/* At a tc hook: whether skb is subject to loss in `dir` (its link's
 * configuration and counters in *c, *n). A copy duplicate() made is not: it
 * passes as it is, its mark cleared. */
static __always_inline int tc_subject(struct __sk_buff *skb, __u32 dir, struct swml_loss_link *l)
{
	if (skb->mark == SWML_LOSS_MARK) {
		skb->mark = 0;
		return 0;
	}
	return lookup(skb->ifindex, dir, l) && skb_subject(skb);
}

int swml_loss_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct swml_loss_link l;
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct udphdr *udp;
	__be16 sport = 0, dport = 0;
	int have_l4 = 0;

	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->ihl < 5)
		return XDP_PASS;
	udp = (void *)ip + ip->ihl * 4;
	if ((void *)(udp + 1) <= data_end) {
		sport = udp->source;
		dport = udp->dest;
		have_l4 = 1;
	}
	if (!subject(ip->protocol, ip->frag_off, have_l4, sport, dport))
		return XDP_PASS;
	if (!lookup(ctx->ingress_ifindex, SWML_LOSS_UP, &l))
		return XDP_PASS;
	return drop_one(&l) ? XDP_DROP : XDP_PASS; /* duplication, if any: at tc ingress */
}

int swml_loss_ingress(struct __sk_buff *skb)
{
	struct swml_loss_link l;

	if (tc_subject(skb, SWML_LOSS_UP, &l) && chance(l.cfg->dup))
		duplicate(skb, BPF_F_INGRESS, l.n);
	return TC_ACT_OK;
}

int swml_loss_egress(struct __sk_buff *skb)
{
	struct swml_loss_link l;

	if (!tc_subject(skb, SWML_LOSS_DOWN, &l))
		return TC_ACT_OK;
	if (drop_one(&l))
		return TC_ACT_SHOT;
	if (chance(l.cfg->dup))
		duplicate(skb, 0, l.n);
	return TC_ACT_OK;
}
