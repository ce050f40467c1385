/* SPDX-License-Identifier: MIT */
#include "port.h"

#include <string.h>

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
	if (!p->xsk.zero_copy && cfg->udp_tx)
		p->tx_kind = SWML_PORT_UDP;
	return 0;
}

void swml_port_close(struct swml_port *p)
{
	if (p->kind == SWML_PORT_XSK)
		swml_xsk_close(&p->xsk);
	if (p->kind == SWML_PORT_UDP || p->strays_open)
		swml_udp_close(&p->udp);
}
