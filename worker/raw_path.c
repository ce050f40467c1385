/* SPDX-License-Identifier: MIT */
#define _GNU_SOURCE
#include "raw_path.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <string.h>
#include <time.h>

/* Where a frame's number sits: the swml header's seq. */
#define SEQ_OFF (SWML_L2L4_LEN + offsetof(struct swml_hdr, seq))

struct raw {
	struct swml_port *p;
	const struct swml_raw_cfg *c;
	struct swml_raw_result *r;
	uint8_t frame[SWML_XSK_FRAME_SIZE]; /* what is sent, seq aside */
	uint8_t echo[SWML_XSK_FRAME_SIZE];  /* what must come back, seq aside */
	uint32_t len;
	uint32_t next_seq, floor; /* frames numbered floor..next_seq-1 may still come back */
	uint64_t inflight;
	int counting;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The frame as sent, and as the reflector sends it back: Ethernet and IPv4
 * addresses and UDP ports swapped, nothing else changed. */
static void build_frames(struct raw *s)
{
	const struct swml_addrs *a = &s->c->addrs;
	struct swml_addrs back = {.src_port = a->dst_port, .dst_port = a->src_port};
	struct swml_data_id id = {.job = 0, .count = (uint16_t)s->c->k, .fmt = SWML_FMT_INT32};
	uint8_t *h = s->frame + SWML_L2L4_LEN;
	uint32_t *payload = (uint32_t *)(h + SWML_HDR_LEN);

	memcpy(back.src_mac, a->dst_mac, 6);
	memcpy(back.dst_mac, a->src_mac, 6);
	memcpy(back.src_ip, a->dst_ip, 4);
	memcpy(back.dst_ip, a->src_ip, 4);
	swml_build_template(s->frame, a, s->c->k, SWML_FMT_INT32);
	swml_write_data_hdr(h, &id, 0, 0, 0, 0, 0, 0);
	h[offsetof(struct swml_hdr, ver_type)] = (SWML_VERSION << 4) | SWML_TYPE_RESULT;
	for (uint32_t i = 0; i < s->c->k; i++) /* a pattern a bad copy would break */
		payload[i] = 0x9e3779b9u * (i + 1);
	memcpy(s->echo, s->frame, s->len);
	swml_build_template(s->echo, &back, s->c->k, SWML_FMT_INT32);
}

/* Fill the window, kicking the socket once every `batch` frames. */
static int send_frames(struct raw *s)
{
	while (s->inflight < s->c->window) {
		uint32_t n = 0;

		while (n < s->c->batch && s->inflight < s->c->window) {
			uint8_t *f = swml_port_tx_reserve(s->p, s->len);
			uint32_t seq = htonl(s->next_seq);

			if (!f)
				break;
			memcpy(f, s->frame, s->len);
			memcpy(f + SEQ_OFF, &seq, sizeof seq);
			s->next_seq++;
			s->inflight++;
			n++;
		}
		if (s->counting)
			s->r->sent += n;
		swml_port_submit(s->p);
		if (swml_port_kick(s->p) < 0)
			return -errno;
		if (n < s->c->batch && s->inflight < s->c->window)
			return 0; /* no tx frame or ring room: the completions free some */
	}
	return 0;
}

/* An echo is the frame sent, addresses and ports swapped, but for its seq and
 * what the kernel writes where it sends (port.h: UDP in copy mode): the
 * IPv4 header's ID, flags, TTL and checksum and the UDP checksum. */
#define IP_ADDRS_OFF (SWML_ETH_LEN + 12) /* source and destination, 8 bytes */
#define UDP_OFF (SWML_ETH_LEN + SWML_IP_LEN)
static int intact(const struct raw *s, const uint8_t *f, uint32_t len)
{
	return len == s->len && !memcmp(f, s->echo, SWML_ETH_LEN) &&
	       !memcmp(f + IP_ADDRS_OFF, s->echo + IP_ADDRS_OFF, 8) &&
	       !memcmp(f + UDP_OFF, s->echo + UDP_OFF, 6) && /* ports, length */
	       !memcmp(f + SWML_L2L4_LEN, s->echo + SWML_L2L4_LEN, SEQ_OFF - SWML_L2L4_LEN) &&
	       !memcmp(f + SEQ_OFF + 4, s->echo + SEQ_OFF + 4, len - SEQ_OFF - 4);
}

/* Up to `batch` frames received; returns how many were echoes. */
static uint32_t take_echoes(struct raw *s)
{
	const uint8_t *frames[SWML_PORT_RX_BATCH];
	uint32_t lens[SWML_PORT_RX_BATCH];
	uint32_t echoes = 0, n = swml_port_rx(s->p, frames, lens);

	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *f = frames[i];
		uint32_t seq;

		if (!intact(s, f, lens[i])) {
			s->r->bad++;
			continue;
		}
		memcpy(&seq, f + SEQ_OFF, sizeof seq);
		seq = ntohl(seq);
		if ((uint32_t)(seq - s->floor) >= (uint32_t)(s->next_seq - s->floor) ||
		    !s->inflight) {
			s->r->late++;
			continue;
		}
		s->inflight--;
		echoes++;
	}
	swml_port_rx_done(s->p);
	if (s->counting)
		s->r->echoed += echoes;
	return echoes;
}

static void sleep_rx(struct raw *s)
{
	struct pollfd pfd = {.fd = swml_port_fd(s->p), .events = POLLIN};
	struct timespec ts = {.tv_sec = 0, .tv_nsec = SWML_RAW_SLEEP_NS};

	s->r->sleeps++;
	ppoll(&pfd, 1, &ts, NULL);
}

int swml_raw_run(struct swml_port *p, const struct swml_raw_cfg *cfg, struct swml_raw_result *r)
{
	struct raw s = {.p = p, .c = cfg, .r = r};
	uint64_t start, count_from, end, last_echo, now, kicks0;
	uint32_t idle = 0;
	int ret = 0;

	memset(r, 0, sizeof *r);
	s.len = SWML_HEADERS_LEN + 4 * cfg->k;
	r->frame_len = s.len;
	if (cfg->k < 1 || cfg->k > SWML_MAX_K || s.len > SWML_XSK_FRAME_SIZE - SWML_XSK_TX_OFFSET ||
	    cfg->window < 1 || cfg->window > p->xsk.nframes / 2 || cfg->batch < 1 ||
	    cfg->batch > SWML_PORT_RX_BATCH)
		return -EINVAL;
	build_frames(&s);
	start = now = last_echo = now_ns();
	count_from = start + cfg->warmup_ns;
	end = count_from + cfg->duration_ns;
	kicks0 = swml_port_kicks(p);
	ret = send_frames(&s);
	while (!ret && now < end) {
		uint32_t got;

		if (cfg->abort && __atomic_load_n(cfg->abort, __ATOMIC_RELAXED))
			break;
		if (!s.counting && now >= count_from) {
			uint64_t bad = r->bad;

			memset(r, 0, sizeof *r);
			r->bad = bad; /* a bad frame is worth seeing, warm or not */
			r->frame_len = s.len;
			kicks0 = swml_port_kicks(p);
			count_from = now;
			s.counting = 1;
		}
		got = take_echoes(&s);
		now = now_ns();
		if (got) {
			last_echo = now;
			idle = 0;
		} else if (s.inflight && now - last_echo > SWML_RAW_LOSS_NS) {
			if (s.counting)
				r->lost += s.inflight;
			s.inflight = 0;
			s.floor = s.next_seq;
			last_echo = now;
		}
		ret = send_frames(&s);
		if (!got && ++idle > cfg->spin) {
			sleep_rx(&s);
			idle = cfg->spin; /* one empty poll after a wake-up, then sleep again */
			now = now_ns();
		}
	}
	r->elapsed_ns = s.counting ? now - count_from : 0;
	r->kicks = swml_port_kicks(p) - kicks0;
	return ret;
}
