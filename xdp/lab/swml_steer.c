/* SPDX-License-Identifier: MIT */
/*
 * swml_steer.c - the lab's stand-in for a NIC's ntuple rules: a tc program
 * on the ingress of every bridge port of a lab whose links have several
 * queues (Lab(link_queues=Q), switchml_xdp/lab/steering.py).
 *
 * A NIC puts a received frame on the queue its rules or its RSS hash pick;
 * an AF_XDP socket takes frames from its own queue alone, so a worker that
 * streams in lanes over AF_XDP needs lane q's port (the job's port + q) on
 * receive queue q (`ethtool -N IFACE flow-type udp4 dst-port P+q action q`).
 * A veth's receive queue is the transmit queue its peer picked, and for a
 * frame the bridge forwards that is the receive queue recorded in the skb
 * (skb_tx_hash). So this program records queue `port mod SWML_STEER_QUEUES`
 * for every IPv4 UDP frame entering the bridge, and the frame comes in on
 * that queue at whichever host it goes to: the rule above for a job whose
 * port is a multiple of Q, as the default port, 48864, is for every Q up to
 * 16. Everything else keeps the kernel's flow hash.
 *
 * Specialised at load time: SWML_STEER_QUEUES, the links' queues.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/udp.h>

#include "swml_parse.h"

#ifndef SWML_STEER_QUEUES
#error "SWML_STEER_QUEUES must be defined"
#endif

int swml_steer(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct iphdr *ip = 0;
	struct udphdr *udp = 0;

	if (swml_parse_udp_any(data, data_end, &ip, &udp) != SWML_PARSE_NOT_OURS)
		/* queue_mapping holds the recorded receive queue plus one */
		skb->queue_mapping = bpf_ntohs(udp->dest) % SWML_STEER_QUEUES + 1;
	/* Not TC_ACT_OK, which would end the port's filters here: the loss
	 * injector's ingress filter (xdp/lab/swml_loss.c) runs after this one. */
	return TC_ACT_UNSPEC;
}
