/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include "udp_port.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/udp.h>
#include <sys/mman.h>

#include "packet.h"

_Static_assert(SWML_UDP_FRAME_SIZE >= SWML_UDP_TX_OFFSET + SWML_PAGE_FRAME_LEN,
	       "a frame holds the largest frame");
_Static_assert((SWML_UDP_TX_FRAMES & (SWML_UDP_TX_FRAMES - 1)) == 0, "a power of two");

/* IP_TOS as one int of ancillary data: what IP_RECVTOS delivers (a byte) fits. */
#define CTRL_LEN CMSG_SPACE(sizeof(int))
/* A message's UDP_SEGMENT: the size of its datagrams, a uint16_t. */
#define GSO_CTRL_LEN CMSG_SPACE(sizeof(uint16_t))

static void *area(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

int swml_udp_open(struct swml_udp *u, int fd, const uint8_t dst_ip[4], uint16_t dst_port, char *err,
		  size_t errlen)
{
	const int one = 1;

	memset(u, 0, sizeof *u);
	u->fd = fd;
	u->tos = -1;
	u->gso = 1;
	u->dst.sin_family = AF_INET;
	memcpy(&u->dst.sin_addr, dst_ip, 4);
	u->dst.sin_port = htons(dst_port);
	/* each RESULT's TOS carries the job's DSCP mark (docs/transport.md) */
	if (setsockopt(fd, IPPROTO_IP, IP_RECVTOS, &one, sizeof one) < 0) {
		snprintf(err, errlen, "IP_RECVTOS on the udp socket: %s", strerror(errno));
		return -errno;
	}
	u->tx_area = area((size_t)SWML_UDP_TX_FRAMES * SWML_UDP_FRAME_SIZE);
	u->rx_area = area((size_t)SWML_UDP_RX_BATCH * SWML_UDP_FRAME_SIZE);
	u->tx_len = calloc(SWML_UDP_TX_FRAMES, sizeof *u->tx_len);
	u->tx_msgs = calloc(SWML_UDP_TX_FRAMES, sizeof *u->tx_msgs);
	u->tx_iov = calloc(SWML_UDP_TX_FRAMES, sizeof *u->tx_iov);
	u->tx_msg_frames = calloc(SWML_UDP_TX_FRAMES, sizeof *u->tx_msg_frames);
	u->tx_ctrl = calloc(SWML_UDP_TX_FRAMES, GSO_CTRL_LEN);
	u->rx_msgs = calloc(SWML_UDP_RX_BATCH, sizeof *u->rx_msgs);
	u->rx_iov = calloc(SWML_UDP_RX_BATCH, sizeof *u->rx_iov);
	u->rx_from = calloc(SWML_UDP_RX_BATCH, sizeof *u->rx_from);
	u->rx_ctrl = calloc(SWML_UDP_RX_BATCH, CTRL_LEN);
	if (!u->tx_area || !u->rx_area || !u->tx_len || !u->tx_msgs || !u->tx_iov ||
	    !u->tx_msg_frames || !u->tx_ctrl || !u->rx_msgs || !u->rx_iov || !u->rx_from ||
	    !u->rx_ctrl) {
		swml_udp_close(u);
		snprintf(err, errlen, "cannot allocate the udp port's frames");
		return -ENOMEM;
	}
	/* the receive messages point at their frames once; swml_udp_rx resets
	 * only what the kernel writes back */
	for (uint32_t i = 0; i < SWML_UDP_RX_BATCH; i++) {
		uint8_t *f = u->rx_area + (size_t)i * SWML_UDP_FRAME_SIZE;

		u->rx_iov[i] =
			(struct iovec){f + SWML_L2L4_LEN, SWML_UDP_FRAME_SIZE - SWML_L2L4_LEN};
		u->rx_msgs[i].msg_hdr = (struct msghdr){.msg_name = &u->rx_from[i],
							.msg_iov = &u->rx_iov[i],
							.msg_iovlen = 1,
							.msg_control = u->rx_ctrl + i * CTRL_LEN};
	}
	return 0;
}

void swml_udp_close(struct swml_udp *u)
{
	if (u->tx_area)
		munmap(u->tx_area, (size_t)SWML_UDP_TX_FRAMES * SWML_UDP_FRAME_SIZE);
	if (u->rx_area)
		munmap(u->rx_area, (size_t)SWML_UDP_RX_BATCH * SWML_UDP_FRAME_SIZE);
	free(u->tx_len);
	free(u->tx_msgs);
	free(u->tx_iov);
	free(u->tx_msg_frames);
	free(u->tx_ctrl);
	free(u->rx_msgs);
	free(u->rx_iov);
	free(u->rx_from);
	free(u->rx_ctrl);
	memset(u, 0, sizeof *u);
	u->fd = -1;
}

static uint8_t *tx_frame(const struct swml_udp *u, uint32_t i)
{
	return u->tx_area + (size_t)i * SWML_UDP_FRAME_SIZE + SWML_UDP_TX_OFFSET;
}

uint8_t *swml_udp_tx_reserve(struct swml_udp *u, uint32_t len)
{
	uint32_t i;

	if (u->tx_count == SWML_UDP_TX_FRAMES || len < SWML_L2L4_LEN)
		return NULL;
	i = (u->tx_head + u->tx_count++) & (SWML_UDP_TX_FRAMES - 1);
	u->tx_len[i] = len;
	return tx_frame(u, i);
}

/* The TOS the stream wrote into a frame's IPv4 header. */
static int frame_tos(const uint8_t *f)
{
	return f[SWML_ETH_LEN + 1];
}

/* One message of frames [from, from + n) of the run (tx_iov filled): a
 * datagram, or under GSO several of one size, the last maybe shorter. */
static void message(struct swml_udp *u, uint32_t msg, uint32_t from, uint32_t n, uint32_t dgram_len)
{
	struct msghdr *h = &u->tx_msgs[msg].msg_hdr;

	*h = (struct msghdr){.msg_name = &u->dst,
			     .msg_namelen = sizeof u->dst,
			     .msg_iov = &u->tx_iov[from],
			     .msg_iovlen = n};
	u->tx_msg_frames[msg] = n;
	if (n > 1) {
		uint8_t *ctrl = u->tx_ctrl + (size_t)msg * GSO_CTRL_LEN;
		struct cmsghdr *c;
		const uint16_t size = (uint16_t)dgram_len;

		memset(ctrl, 0, GSO_CTRL_LEN);
		h->msg_control = ctrl;
		h->msg_controllen = GSO_CTRL_LEN;
		c = CMSG_FIRSTHDR(h);
		c->cmsg_level = SOL_UDP;
		c->cmsg_type = UDP_SEGMENT;
		c->cmsg_len = CMSG_LEN(sizeof size);
		memcpy(CMSG_DATA(c), &size, sizeof size);
	}
}

/* sendmmsg of up to n frames from the oldest, all with the same TOS (the
 * socket's, set first if it changed), as messages of one datagram or, under
 * GSO, of a run of datagrams of one size; how many frames went, or -errno. */
static int send_run(struct swml_udp *u, uint32_t n)
{
	const int tos = frame_tos(tx_frame(u, u->tx_head));
	uint32_t m = 0, msgs = 0, from = 0, dgram = 0, frames = 0;
	int sent;

	if (tos != u->tos) {
		if (setsockopt(u->fd, IPPROTO_IP, IP_TOS, &tos, sizeof tos) < 0)
			return -errno;
		u->tos = tos;
	}
	for (; m < n; m++) {
		const uint32_t i = (u->tx_head + m) & (SWML_UDP_TX_FRAMES - 1);
		uint8_t *f = tx_frame(u, i);
		const uint32_t len = u->tx_len[i] - SWML_L2L4_LEN;

		if (frame_tos(f) != tos)
			break;
		/* a new message unless this datagram extends the current one:
		 * GSO on, the same size (a shorter one ends it), room left */
		if (m > from &&
		    (!u->gso || len > dgram || m - from >= SWML_UDP_GSO_MAX ||
		     (m - from + 1) * dgram > SWML_UDP_GSO_BYTES ||
		     u->tx_len[(i - 1) & (SWML_UDP_TX_FRAMES - 1)] - SWML_L2L4_LEN != dgram)) {
			message(u, msgs++, from, m - from, dgram);
			from = m;
		}
		if (m == from)
			dgram = len;
		u->tx_iov[m] = (struct iovec){f + SWML_L2L4_LEN, len};
	}
	if (m > from)
		message(u, msgs++, from, m - from, dgram);
	u->kicks++;
	sent = sendmmsg(u->fd, u->tx_msgs, msgs, MSG_DONTWAIT);
	if (sent < 0)
		return -errno;
	for (int j = 0; j < sent; j++) {
		frames += u->tx_msg_frames[j];
		u->gso_sends += u->tx_msg_frames[j] > 1;
	}
	return (int)frames;
}

int swml_udp_kick(struct swml_udp *u)
{
	while (u->tx_count) {
		/* up to the ring's end: a run is contiguous in tx_iov */
		const uint32_t to_end = SWML_UDP_TX_FRAMES - u->tx_head;
		const int sent = send_run(u, u->tx_count < to_end ? u->tx_count : to_end);

		if (sent < 0) {
			switch (-sent) {
			case EINTR:
				continue;
			case EAGAIN:  /* the socket's send buffer is full: later */
			case ENOBUFS: /* the device queue is */
				u->kick_errors++;
				return 0;
			case EINVAL: /* no UDP GSO here (or not on this route): */
			case EIO:    /* one message a datagram from now on */
			case EOPNOTSUPP:
				if (u->gso) {
					u->gso = 0;
					continue;
				}
				/* fall through */
			default:
				u->kick_errors++;
				return sent;
			}
		}
		if (sent == 0)
			return 0;
		u->tx_head = (u->tx_head + (uint32_t)sent) & (SWML_UDP_TX_FRAMES - 1);
		u->tx_count -= (uint32_t)sent;
	}
	return 0;
}

/* The TOS IP_RECVTOS delivered with a datagram (0 if none came). */
static uint8_t received_tos(struct msghdr *m)
{
	for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c))
		if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS &&
		    c->cmsg_len > CMSG_LEN(0))
			return *(uint8_t *)CMSG_DATA(c);
	return 0;
}

uint32_t swml_udp_rx(struct swml_udp *u, const uint8_t **frames, uint32_t *lens, uint32_t max)
{
	int n;

	if (max > SWML_UDP_RX_BATCH)
		max = SWML_UDP_RX_BATCH;
	for (uint32_t i = 0; i < max; i++) { /* what the last call wrote back */
		u->rx_msgs[i].msg_hdr.msg_namelen = sizeof u->rx_from[i];
		u->rx_msgs[i].msg_hdr.msg_controllen = CTRL_LEN;
	}
	n = recvmmsg(u->fd, u->rx_msgs, max, MSG_DONTWAIT, NULL);
	if (n <= 0)
		return 0; /* EAGAIN: nothing now; a failing socket shows as silence (the stall) */
	for (int i = 0; i < n; i++) {
		struct msghdr *m = &u->rx_msgs[i].msg_hdr;
		uint8_t *f = u->rx_area + (size_t)i * SWML_UDP_FRAME_SIZE;
		uint8_t *ip = f + SWML_ETH_LEN, *udp = ip + SWML_IP_LEN;

		/* The prefix packet.h parses, from what the kernel checked:
		 * IPv4 without options, UDP, the sender's address and port. */
		memset(f, 0, SWML_L2L4_LEN);
		f[12] = 0x08;
		ip[0] = 0x45;
		ip[1] = received_tos(m);
		ip[9] = 17;
		if (m->msg_namelen >= sizeof(struct sockaddr_in) &&
		    u->rx_from[i].sin_family == AF_INET) {
			memcpy(ip + 12, &u->rx_from[i].sin_addr, 4);
			memcpy(udp, &u->rx_from[i].sin_port, 2);
		}
		frames[i] = f;
		lens[i] = SWML_L2L4_LEN + u->rx_msgs[i].msg_len;
		if (m->msg_flags & MSG_TRUNC) { /* longer than any frame: not ours */
			u->rx_truncated++;
			lens[i] = 0;
		}
	}
	return (uint32_t)n;
}
