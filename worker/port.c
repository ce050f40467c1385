/* SPDX-License-Identifier: MIT */
#include "port.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int swml_port_open(struct swml_port *p, const struct swml_port_cfg *cfg, char *err, size_t errlen)
{
	int ret;

	memset(p, 0, sizeof *p);
	p->kind = p->tx_kind =
		cfg->udp_fd >= 0 && cfg->xskmap_fd < 0 ? SWML_PORT_UDP : SWML_PORT_XSK;
	if (p->kind == SWML_PORT_UDP) {
		ret = swml_udp_open(&p->udp, cfg->udp_fd, cfg->dst_ip, cfg->dst_port, err, errlen);
		p->udp.gso = cfg->udp_gso;
		return ret;
	}
	ret = swml_xsk_open(&p->xsk, cfg->ifname, cfg->queue, cfg->frames, cfg->xskmap_fd, err,
			    errlen);
	if (ret || cfg->udp_fd < 0)
		return ret;
	/* The UDP socket beside it: strays come in there (port.h), and in copy
	 * mode the sends go out through it where the caller says the route
	 * allows. */
	ret = swml_udp_open(&p->udp, cfg->udp_fd, cfg->dst_ip, cfg->dst_port, err, errlen);
	if (ret) {
		swml_xsk_close(&p->xsk);
		return ret;
	}
	p->udp.gso = cfg->udp_gso;
	p->strays_open = 1;
	p->udp_tx = cfg->udp_tx;
	if (!p->xsk.zero_copy && cfg->udp_tx)
		p->tx_kind = SWML_PORT_UDP;
	return 0;
}

/* swml_xsk_open, again while the queue is busy (EBUSY) for up to a second:
 * the kernel lets go of a closed socket's queue a little later (its pool is
 * released from a work queue), so the queue just left, or one another
 * socket just left, may not be free yet. */
static int xsk_open_when_free(struct swml_xsk *x, const char *ifname, uint32_t queue,
			      uint32_t nframes, int xskmap_fd, char *err, size_t errlen)
{
	int ret = -EBUSY;

	for (int tries = 0; tries < 100 && ret == -EBUSY; tries++) {
		if (tries)
			usleep(10000);
		ret = swml_xsk_open(x, ifname, queue, nframes, xskmap_fd, err, errlen);
	}
	return ret;
}

int swml_port_rebind(struct swml_port *p, const char *ifname, uint32_t queue, int xskmap_fd,
		     char *err, size_t errlen)
{
	const uint32_t was = p->xsk.queue, nframes = p->xsk.nframes;
	char again[128];
	int ret;

	if (p->kind != SWML_PORT_XSK || !p->xsk.xsk) {
		snprintf(err, errlen, "no AF_XDP socket to move");
		return -EINVAL;
	}
	/* Closed first, opened in place: libxdp keeps the addresses of the
	 * socket's ring structs, so a socket cannot be made elsewhere and
	 * copied in. */
	swml_xsk_close(&p->xsk);
	p->rx_n = 0;
	p->strays_armed = p->strays_come = 0; /* the poll says again whether any come */
	ret = xsk_open_when_free(&p->xsk, ifname, queue, nframes, xskmap_fd, err, errlen);
	if (ret &&
	    xsk_open_when_free(&p->xsk, ifname, was, nframes, xskmap_fd, again, sizeof again)) {
		size_t n = strlen(err);

		snprintf(err + n, errlen - n, "; back on queue %u neither: %s", was, again);
		return ret;
	}
	/* here, or back where it was */
	p->tx_kind =
		p->strays_open && !p->xsk.zero_copy && p->udp_tx ? SWML_PORT_UDP : SWML_PORT_XSK;
	return ret;
}

void swml_port_close(struct swml_port *p)
{
	if (p->kind == SWML_PORT_XSK)
		swml_xsk_close(&p->xsk);
	if (p->kind == SWML_PORT_UDP || p->strays_open)
		swml_udp_close(&p->udp);
}
