/* SPDX-License-Identifier: MIT */
/*
 * port.h - the stream's one door to a datapath: an AF_XDP socket (xsk_port.h,
 * the afxdp backend) or a kernel UDP socket (udp_port.h, the udp backend).
 * Both take whole frames (Ethernet first) to send and give whole frames
 * received, so stream.c builds and parses one packet format over either.
 */
#ifndef SWML_PORT_H
#define SWML_PORT_H

#include <stdint.h>

#include "udp_port.h"
#include "xsk_port.h"

enum swml_port_kind { SWML_PORT_XSK = 0, SWML_PORT_UDP = 1 };

#define SWML_PORT_RX_BATCH 64u

struct swml_port {
	enum swml_port_kind kind;
	struct swml_xsk xsk;
	struct swml_udp udp;
	/* the frames of the last swml_port_rx (AF_XDP: their UMEM addresses) */
	uint64_t rx_addrs[SWML_PORT_RX_BATCH];
	uint32_t rx_n;
};

static inline int swml_port_fd(const struct swml_port *p)
{
	return p->kind == SWML_PORT_XSK ? p->xsk.fd : p->udp.fd;
}

static inline uint8_t *swml_port_tx_reserve(struct swml_port *p, uint32_t len)
{
	return p->kind == SWML_PORT_XSK ? swml_xsk_tx_reserve(&p->xsk, len)
					: swml_udp_tx_reserve(&p->udp, len);
}

/* Reserved frames count as pending from here (AF_XDP: published to the
 * kernel; UDP: they already are). */
static inline void swml_port_submit(struct swml_port *p)
{
	if (p->kind == SWML_PORT_XSK)
		swml_xsk_submit(&p->xsk);
}

static inline uint32_t swml_port_tx_pending(struct swml_port *p)
{
	return p->kind == SWML_PORT_XSK ? swml_xsk_tx_pending(&p->xsk)
					: swml_udp_tx_pending(&p->udp);
}

static inline int swml_port_kick(struct swml_port *p)
{
	return p->kind == SWML_PORT_XSK ? swml_xsk_kick(&p->xsk) : swml_udp_kick(&p->udp);
}

/* Sent frames back to the free ones (AF_XDP's completion ring; a UDP
 * socket's frames are free once sendmmsg took them). */
static inline void swml_port_reclaim(struct swml_port *p)
{
	if (p->kind == SWML_PORT_XSK)
		swml_xsk_reclaim(&p->xsk);
}

/* Whether few tx frames are left free: time to reclaim. */
static inline int swml_port_tx_low(const struct swml_port *p)
{
	return p->kind == SWML_PORT_XSK && p->xsk.n_free_tx < p->xsk.nframes / 4;
}

/* Up to SWML_PORT_RX_BATCH received frames, valid until swml_port_rx_done(). */
static inline uint32_t swml_port_rx(struct swml_port *p, const uint8_t **frames, uint32_t *lens)
{
	uint32_t idx, n;

	if (p->kind == SWML_PORT_UDP)
		return swml_udp_rx(&p->udp, frames, lens, SWML_PORT_RX_BATCH);
	n = xsk_ring_cons__peek(&p->xsk.rx, SWML_PORT_RX_BATCH, &idx);
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
	if (p->kind == SWML_PORT_XSK && p->rx_n) {
		xsk_ring_cons__release(&p->xsk.rx, p->rx_n);
		swml_xsk_refill(&p->xsk, p->rx_addrs, p->rx_n);
		p->rx_n = 0;
	}
}

static inline uint64_t swml_port_kicks(const struct swml_port *p)
{
	return p->kind == SWML_PORT_XSK ? p->xsk.kicks : p->udp.kicks;
}

static inline uint64_t swml_port_kick_errors(const struct swml_port *p)
{
	return p->kind == SWML_PORT_XSK ? p->xsk.kick_errors : p->udp.kick_errors;
}

#endif /* SWML_PORT_H */
