/* SPDX-License-Identifier: MIT */
/*
 * port.h - the stream's one door to a datapath: an AF_XDP socket (xsk_port.h,
 * the afxdp backend) or a kernel UDP socket (udp_port.h, the udp backend).
 * Both take whole frames (Ethernet first) to send and give whole frames
 * received, so stream.c builds and parses one packet format over either.
 *
 * The two directions may go different ways: an AF_XDP socket in copy mode
 * (no zero-copy driver) receives, and the kernel UDP socket that holds the
 * job's port sends, with UDP GSO. In copy mode the kernel makes an skb of
 * every AF_XDP frame sent and takes it down the path alone; GSO makes one
 * skb of a run of up to 64 datagrams and cuts it late, so the path's
 * per-frame work is paid once a run (docs/performance.md, "The afxdp
 * backend's sends in copy mode").
 *
 * Under an AF_XDP socket the UDP socket also receives: an AF_XDP socket takes
 * one receive queue, and a RESULT the NIC puts on another queue (RSS on a NIC
 * of several queues, without the ntuple rule that steers the port) is passed
 * to the stack by the redirect program (xdp/swml_redirect.c) and arrives at
 * the port's UDP socket. Such strays are read from there, so the call goes on
 * over the stack's path instead of stalling. The socket is read when the
 * sleep's poll saw it readable, and after that whenever the XSK ring is empty
 * once a RESULT has come that way: a flow's RSS queue does not change, so
 * either none of a lane's RESULTs stray or all of them do, until the socket
 * moves to their queue (swml_port_rebind), which starts the watch afresh.
 */
#ifndef SWML_PORT_H
#define SWML_PORT_H

#include <stddef.h>
#include <stdint.h>

#include "udp_port.h"
#include "xsk_port.h"

enum swml_port_kind { SWML_PORT_XSK = 0, SWML_PORT_UDP = 1 };

#define SWML_PORT_RX_BATCH 64u

struct swml_port {
	enum swml_port_kind kind;    /* what receives (and its fd is polled) */
	enum swml_port_kind tx_kind; /* what sends: kind, or UDP under an XSK in copy mode */
	struct swml_xsk xsk;
	struct swml_udp udp;
	/* the frames of the last swml_port_rx (AF_XDP: their UMEM addresses) */
	uint64_t rx_addrs[SWML_PORT_RX_BATCH];
	uint32_t rx_n;
	enum swml_port_kind rx_from; /* where the last swml_port_rx read */
	int strays_open;             /* an XSK receives and the UDP socket is open beside it */
	int strays_armed;            /* read the UDP socket when the XSK ring is empty */
	int strays_come;             /* a RESULT came that way since the socket was bound */
	uint64_t strays;             /* RESULTs of the job read there (swml_port_result_seen) */
	int udp_tx;                  /* the cfg's: copy mode may send through the UDP socket */
};

/* How to open a port: an AF_XDP socket (xskmap_fd >= 0, on ifname's queue),
 * a kernel UDP socket (udp_fd alone), or both, the UDP socket then taking
 * strays, and sending while the AF_XDP one is in copy mode (with udp_tx). */
struct swml_port_cfg {
	const char *ifname;
	uint32_t queue, frames; /* the AF_XDP socket's queue and UMEM frames */
	int xskmap_fd;          /* -1: no AF_XDP socket */
	int udp_fd;             /* -1: none; the caller's, bound, kept open meanwhile */
	int udp_gso;            /* runs of datagrams as UDP GSO messages */
	int udp_tx;             /* under an AF_XDP socket in copy mode: send through udp_fd */
	uint8_t dst_ip[4];      /* the UDP socket's datagrams go here (network order) */
	uint16_t dst_port;      /* host order */
};

/* 0, or -errno with a message in err; nothing is left open on failure. */
int swml_port_open(struct swml_port *p, const struct swml_port_cfg *cfg, char *err, size_t errlen);
void swml_port_close(struct swml_port *p);

/* Between calls: the AF_XDP socket moved to rx queue `queue` of ifname (the
 * old UMEM and socket closed, which takes them out of xskmap_fd; new ones
 * there, inserted at that queue). 0, or -errno with a message in err: the
 * socket is back on its old queue, or where that failed too, the port has
 * no AF_XDP socket (p->xsk.xsk NULL) and must be closed. */
int swml_port_rebind(struct swml_port *p, const char *ifname, uint32_t queue, int xskmap_fd,
		     char *err, size_t errlen);

static inline int swml_port_fd(const struct swml_port *p)
{
	return p->kind == SWML_PORT_XSK ? p->xsk.fd : p->udp.fd;
}

static inline uint8_t *swml_port_tx_reserve(struct swml_port *p, uint32_t len)
{
	return p->tx_kind == SWML_PORT_XSK ? swml_xsk_tx_reserve(&p->xsk, len)
					   : swml_udp_tx_reserve(&p->udp, len);
}

/* Reserved frames count as pending from here (AF_XDP: published to the
 * kernel; UDP: they already are). */
static inline void swml_port_submit(struct swml_port *p)
{
	if (p->tx_kind == SWML_PORT_XSK)
		swml_xsk_submit(&p->xsk);
}

static inline uint32_t swml_port_tx_pending(struct swml_port *p)
{
	return p->tx_kind == SWML_PORT_XSK ? swml_xsk_tx_pending(&p->xsk)
					   : swml_udp_tx_pending(&p->udp);
}

static inline int swml_port_kick(struct swml_port *p)
{
	return p->tx_kind == SWML_PORT_XSK ? swml_xsk_kick(&p->xsk) : swml_udp_kick(&p->udp);
}

/* Sent frames back to the free ones (AF_XDP's completion ring; a UDP
 * socket's frames are free once sendmmsg took them). */
static inline void swml_port_reclaim(struct swml_port *p)
{
	if (p->tx_kind == SWML_PORT_XSK)
		swml_xsk_reclaim(&p->xsk);
}

/* Whether few tx frames are left free: time to reclaim. */
static inline int swml_port_tx_low(const struct swml_port *p)
{
	return p->tx_kind == SWML_PORT_XSK && p->xsk.n_free_tx < p->xsk.nframes / 4;
}

/* The UDP socket that strays reach under an XSK (its fd, polled while the
 * stream sleeps), or -1. */
static inline int swml_port_stray_fd(const struct swml_port *p)
{
	return p->strays_open ? p->udp.fd : -1;
}

/* The sleep's poll saw the stray socket readable: read it. */
static inline void swml_port_arm_strays(struct swml_port *p)
{
	p->strays_armed = p->strays_open;
}

/* Strays from the UDP socket, when the XSK ring had nothing. */
static inline uint32_t swml_port_rx_strays(struct swml_port *p, const uint8_t **frames,
					   uint32_t *lens)
{
	uint32_t n = swml_udp_rx(&p->udp, frames, lens, SWML_PORT_RX_BATCH);

	p->rx_from = SWML_PORT_UDP;
	if (!n && !p->strays_come)
		p->strays_armed = 0; /* no RESULT has come that way: back to the poll's word */
	return n;
}

/* The stream parsed a RESULT of its job among the frames the last
 * swml_port_rx read: count it if they were strays. */
static inline void swml_port_result_seen(struct swml_port *p)
{
	if (p->kind == SWML_PORT_XSK && p->rx_from == SWML_PORT_UDP) {
		p->strays++;
		p->strays_come = 1;
	}
}

/* Up to SWML_PORT_RX_BATCH received frames, valid until swml_port_rx_done(). */
static inline uint32_t swml_port_rx(struct swml_port *p, const uint8_t **frames, uint32_t *lens)
{
	uint32_t idx, n;

	if (p->kind == SWML_PORT_UDP)
		return swml_udp_rx(&p->udp, frames, lens, SWML_PORT_RX_BATCH);
	p->rx_from = SWML_PORT_XSK;
	n = xsk_ring_cons__peek(&p->xsk.rx, SWML_PORT_RX_BATCH, &idx);
	if (!n)
		return p->strays_armed ? swml_port_rx_strays(p, frames, lens) : 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct xdp_desc *d = xsk_ring_cons__rx_desc(&p->xsk.rx, idx + i);

		p->rx_addrs[i] = d->addr;
		frames[i] = xsk_umem__get_data(p->xsk.area, d->addr);
		lens[i] = d->len;
	}
	p->rx_n = n;
	return n;
}

/* The frames of the last swml_port_rx() are read: back to the kernel. */
static inline void swml_port_rx_done(struct swml_port *p)
{
	if (p->kind == SWML_PORT_XSK && p->rx_from == SWML_PORT_XSK && p->rx_n) {
		xsk_ring_cons__release(&p->xsk.rx, p->rx_n);
		swml_xsk_refill(&p->xsk, p->rx_addrs, p->rx_n);
		p->rx_n = 0;
	}
}

static inline uint64_t swml_port_kicks(const struct swml_port *p)
{
	return p->tx_kind == SWML_PORT_XSK ? p->xsk.kicks : p->udp.kicks;
}

static inline uint64_t swml_port_kick_errors(const struct swml_port *p)
{
	return p->tx_kind == SWML_PORT_XSK ? p->xsk.kick_errors : p->udp.kick_errors;
}

#endif /* SWML_PORT_H */
