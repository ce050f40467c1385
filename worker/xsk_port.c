/* SPDX-License-Identifier: MIT */
#include "xsk_port.h"

#include "swml_wire.h"

/* XDP_PACKET_HEADROOM, then the largest frame, in one UMEM frame. */
_Static_assert(SWML_XSK_FRAME_SIZE >= 256 + SWML_PAGE_FRAME_LEN, "a UMEM frame holds a frame");
_Static_assert(SWML_XSK_FRAME_SIZE >= SWML_XSK_TX_OFFSET + SWML_PAGE_FRAME_LEN,
	       "a tx frame holds a frame");

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>

#ifndef SOL_XDP
#define SOL_XDP 283
#endif

int swml_xsk_open(struct swml_xsk *x, const char *ifname, uint32_t queue, uint32_t nframes,
		  int xskmap_fd, char *err, size_t errlen)
{
	struct xsk_umem_config ucfg = {
		.fill_size = SWML_XSK_FILL_RING,
		.comp_size = SWML_XSK_COMP_RING,
		.frame_size = SWML_XSK_FRAME_SIZE,
		.frame_headroom = 0,
		.flags = 0,
	};
	struct xsk_socket_config scfg = {
		.rx_size = SWML_XSK_RX_RING,
		.tx_size = SWML_XSK_TX_RING,
		.libxdp_flags = XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD,
		.xdp_flags = 0,
		.bind_flags = XDP_COPY,
	};
	uint32_t nrx, idx, i;
	int ret;

	memset(x, 0, sizeof *x);
	x->fd = -1;
	x->queue = queue;
	if (nframes < 256 || (nframes & (nframes - 1))) {
		snprintf(err, errlen, "UMEM frames must be a power of two >= 256, not %u", nframes);
		return -EINVAL;
	}
	x->nframes = nframes;
	x->area_len = (size_t)nframes * SWML_XSK_FRAME_SIZE;
	x->area =
		mmap(NULL, x->area_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (x->area == MAP_FAILED) {
		x->area = NULL;
		ret = -errno;
		snprintf(err, errlen, "cannot map %zu bytes of UMEM: %s", x->area_len,
			 strerror(-ret));
		return ret;
	}
	x->free_tx = calloc(nframes / 2, sizeof *x->free_tx);
	if (!x->free_tx) {
		ret = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	/* Zero-copy where the driver has it (the NIC reads and writes the UMEM
	 * itself: mlx5, ice, i40e ...), else copy mode (veth; virtio-net in
	 * Debian 12's kernel). A socket whose bind failed keeps its rings, and a
	 * second bind on the UMEM's first socket would find them taken: the
	 * fallback starts again from a new UMEM registration. */
	for (int attempt = 0; attempt < 2; attempt++) {
		scfg.bind_flags = attempt == 0 ? XDP_ZEROCOPY : XDP_COPY;
		ret = xsk_umem__create(&x->umem, x->area, x->area_len, &x->fill, &x->comp, &ucfg);
		if (ret) {
			snprintf(err, errlen, "cannot register the UMEM (xsk_umem__create): %s",
				 strerror(-ret));
			x->umem = NULL;
			goto fail;
		}
		ret = xsk_socket__create(&x->xsk, ifname, queue, x->umem, &x->rx, &x->tx, &scfg);
		if (!ret) {
			x->zero_copy = attempt == 0;
			break;
		}
		x->xsk = NULL;
		xsk_umem__delete(x->umem);
		x->umem = NULL;
	}
	if (ret) {
		snprintf(err, errlen, "cannot bind an AF_XDP socket (copy mode) to %s queue %u: %s",
			 ifname, queue, strerror(-ret));
		x->xsk = NULL;
		goto fail;
	}
	x->fd = xsk_socket__fd(x->xsk);

	/* Receive half: all of it into the fill ring. */
	nrx = nframes / 2;
	if (xsk_ring_prod__reserve(&x->fill, nrx, &idx) != nrx) {
		ret = -ENOSPC;
		snprintf(err, errlen, "fill ring too small for %u frames", nrx);
		goto fail;
	}
	for (i = 0; i < nrx; i++)
		*xsk_ring_prod__fill_addr(&x->fill, idx + i) = (uint64_t)i * SWML_XSK_FRAME_SIZE;
	xsk_ring_prod__submit(&x->fill, nrx);
	/* Transmit half: the free stack. */
	for (i = 0; i < nframes / 2; i++)
		x->free_tx[i] = (uint64_t)(nrx + i) * SWML_XSK_FRAME_SIZE;
	x->n_free_tx = nframes / 2;

	if (xskmap_fd >= 0) {
		ret = xsk_socket__update_xskmap(x->xsk, xskmap_fd);
		if (ret) {
			snprintf(err, errlen, "cannot insert the AF_XDP socket into the XSKMAP: %s",
				 strerror(-ret));
			goto fail;
		}
	}
	return 0;

fail:
	swml_xsk_close(x);
	return ret < 0 ? ret : -EIO;
}

void swml_xsk_close(struct swml_xsk *x)
{
	if (x->xsk)
		xsk_socket__delete(x->xsk); /* also leaves the XSKMAP: the map holds no fd */
	x->xsk = NULL;
	x->fd = -1;
	if (x->umem)
		xsk_umem__delete(x->umem);
	x->umem = NULL;
	if (x->area)
		munmap(x->area, x->area_len);
	x->area = NULL;
	free(x->free_tx);
	x->free_tx = NULL;
	x->n_free_tx = 0;
}

uint32_t swml_xsk_reclaim(struct swml_xsk *x)
{
	uint32_t idx, n = xsk_ring_cons__peek(&x->comp, SWML_XSK_COMP_RING, &idx);

	for (uint32_t i = 0; i < n; i++) {
		uint64_t addr = *xsk_ring_cons__comp_addr(&x->comp, idx + i);

		x->free_tx[x->n_free_tx++] = addr - (addr % SWML_XSK_FRAME_SIZE);
	}
	if (n)
		xsk_ring_cons__release(&x->comp, n);
	return n;
}

uint8_t *swml_xsk_tx_reserve(struct swml_xsk *x, uint32_t len)
{
	uint32_t idx;
	uint64_t addr;
	struct xdp_desc *d;

	if (!x->n_free_tx && !swml_xsk_reclaim(x))
		return NULL;
	if (xsk_ring_prod__reserve(&x->tx, 1, &idx) != 1)
		return NULL;
	addr = x->free_tx[--x->n_free_tx] + SWML_XSK_TX_OFFSET;
	d = xsk_ring_prod__tx_desc(&x->tx, idx);
	d->addr = addr;
	d->len = len;
	d->options = 0;
	x->tx_unsubmitted++;
	return xsk_umem__get_data(x->area, addr);
}

void swml_xsk_submit(struct swml_xsk *x)
{
	if (x->tx_unsubmitted) {
		xsk_ring_prod__submit(&x->tx, x->tx_unsubmitted);
		x->tx_unsubmitted = 0;
	}
}

uint32_t swml_xsk_tx_pending(struct swml_xsk *x)
{
	uint32_t cons = __atomic_load_n(x->tx.consumer, __ATOMIC_ACQUIRE);

	return *x->tx.producer - cons;
}

int swml_xsk_kick(struct swml_xsk *x)
{
	for (int tries = 0; tries < 256 && swml_xsk_tx_pending(x); tries++) {
		x->kicks++;
		if (sendto(x->fd, NULL, 0, MSG_DONTWAIT, NULL, 0) >= 0)
			continue;
		switch (errno) {
		case EAGAIN: /* a batch went out, more remain: go on */
		case EINTR:
			continue;
		case EBUSY:   /* the device is busy, or a race with another kick */
		case ENOBUFS: /* out of skbs: try again later */
		case ENETDOWN:
			x->kick_errors++;
			return 0;
		default:
			x->kick_errors++;
			return -errno;
		}
	}
	return 0;
}

void swml_xsk_refill(struct swml_xsk *x, const uint64_t *addrs, uint32_t n)
{
	uint32_t idx;

	/* Cannot fail: the fill ring holds more entries than there are rx frames. */
	if (!n || xsk_ring_prod__reserve(&x->fill, n, &idx) != n)
		return;
	for (uint32_t i = 0; i < n; i++)
		*xsk_ring_prod__fill_addr(&x->fill, idx + i) =
			addrs[i] - (addrs[i] % SWML_XSK_FRAME_SIZE);
	xsk_ring_prod__submit(&x->fill, n);
}

int swml_xsk_statistics(struct swml_xsk *x, struct xdp_statistics *st)
{
	socklen_t len = sizeof *st;

	memset(st, 0, sizeof *st);
	if (x->fd < 0)
		return -EBADF;
	if (getsockopt(x->fd, SOL_XDP, XDP_STATISTICS, st, &len))
		return -errno;
	return 0;
}
