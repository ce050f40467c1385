/* SPDX-License-Identifier: MIT */
/* engine_micro.c - see engine_micro.h. Each stage below is the call stream.c
 * makes for one packet, with the same arguments; frames sit where the rings
 * put them (a tx frame at SWML_XSK_TX_OFFSET in its chunk, a received one
 * after the kernel's 256-byte headroom), so alignments are the engine's. */
#include "engine_micro.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "packet.h"
#include "quant.h"
#include "xsk_port.h"

const char *const swml_micro_stage_names[SWML_MICRO_STAGES] = {
	"exponent", "quantize", "build", "parse", "authenticate", "dequantize"};

#define RX_HEADROOM 256 /* XDP_PACKET_HEADROOM: where a received frame starts */
#define TX_FRAMES 64    /* tx frames in turn, as the ring hands them out */

struct micro {
	const struct swml_micro_cfg *cfg;
	const uint8_t *x;
	uint8_t *y;
	size_t n;
	uint32_t k, L, blocks, frame_len, esize, offset;
	int quantized;
	struct swml_addrs addrs;
	struct swml_data_id id;
	uint8_t tmpl[SWML_L2L4_LEN];
	uint64_t key[2];
	int8_t *lexp;
	uint8_t *lnf;
	struct swml_result *res; /* each block's RESULT, parsed */
	uint8_t *tx, *rx;        /* TX_FRAMES frames; one RESULT frame a block */
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline size_t block_len(const struct micro *m, uint32_t b)
{
	size_t off = (size_t)b * m->k;

	return m->n - off < m->k ? m->n - off : m->k;
}

static inline uint8_t *tx_frame(const struct micro *m, uint32_t b)
{
	return m->tx + (size_t)(b % TX_FRAMES) * SWML_XSK_FRAME_SIZE + SWML_XSK_TX_OFFSET;
}

static inline uint8_t *rx_frame(const struct micro *m, uint32_t b)
{
	return m->rx + (size_t)b * SWML_XSK_FRAME_SIZE + RX_HEADROOM;
}

/* send_new: the block's local exponent and non-finite flag. */
static inline void stage_exponent(struct micro *m, uint32_t b)
{
	int nf;

	if (!m->quantized)
		return;
	m->lexp[b] =
		swml_block_exponent((const float *)m->x + (size_t)b * m->k, block_len(m, b), &nf);
	m->lnf[b] = (uint8_t)nf;
}

/* build's payload; the exponent is this rank's (world copies of x agree). */
static inline void stage_quantize(struct micro *m, uint32_t b, uint8_t *f)
{
	const size_t off = (size_t)b * m->k, len = block_len(m, b);
	void *payload = f + SWML_HEADERS_LEN;

	if (!m->quantized) {
		memcpy(payload, m->x + off * 4, len * 4);
		if (len < m->k)
			memset((int32_t *)payload + len, 0, (m->k - len) * 4);
	} else if (m->cfg->fmt == SWML_FMT_INT16) {
		swml_quantize16_block((const float *)m->x + off, len, m->k, m->lexp[b], payload);
	} else if (m->cfg->one_pass) {
		swml_quantize_block_offset((const float *)m->x + off, len, m->k, m->lexp[b],
					   (int)m->L, m->offset, payload);
	} else {
		swml_quantize_block((const float *)m->x + off, len, m->k, m->lexp[b], (int)m->L,
				    payload);
		swml_offset_block(payload, m->k, m->offset);
	}
}

/* build's headers. */
static inline void stage_build(struct micro *m, uint32_t b, uint8_t *f)
{
	const uint64_t left = (uint64_t)(m->blocks - b) * (m->frame_len - SWML_HEADERS_LEN);
	uint8_t flags = m->quantized && m->lnf[b] ? SWML_FLAG_NONFINITE : 0;

	memcpy(f, m->tmpl, SWML_L2L4_LEN);
	swml_write_data_hdr(f + SWML_L2L4_LEN, &m->id, flags, (uint16_t)(b % 128), b,
			    m->quantized ? m->lexp[b] : 0, 0, swml_pace_encode(left));
}

static inline int stage_parse(struct micro *m, uint32_t b)
{
	return swml_parse_result(rx_frame(m, b), m->frame_len, &m->addrs, m->id.job, m->k,
				 m->cfg->fmt, &m->res[b]);
}

static inline int stage_auth(struct micro *m, uint32_t b)
{
	return swml_result_authentic(rx_frame(m, b), m->frame_len, &m->res[b], m->k, m->key,
				     m->cfg->auth);
}

/* on_result's part for a block: its payload into the output. */
static inline void stage_dequantize(struct micro *m, uint32_t b)
{
	const struct swml_result *r = &m->res[b];
	const size_t off = (size_t)b * m->k, len = block_len(m, b);
	const int nf = r->flags & SWML_FLAG_NONFINITE;

	if (!m->quantized) {
		memcpy(m->y + off * 4, r->payload, len * 4);
	} else if (m->cfg->one_pass && m->cfg->fmt == SWML_FMT_INT16) {
		swml_dequantize16_payload(r->payload, len, r->exp, (int)m->L, nf,
					  (float *)m->y + off);
	} else if (m->cfg->one_pass) {
		swml_dequantize_payload(r->payload, len, m->offset * m->cfg->world, r->exp,
					(int)m->L, nf, (float *)m->y + off);
	} else if (m->cfg->fmt == SWML_FMT_INT16) {
		int16_t q[SWML_MAX_K_INT16] __attribute__((aligned(64)));

		memcpy(q, r->payload, (size_t)m->k * 2);
		swml_dequantize16_block(q, len, r->exp, (int)m->L, nf, (float *)m->y + off);
	} else {
		int32_t sums[SWML_MAX_K] __attribute__((aligned(64)));

		memcpy(sums, r->payload, (size_t)m->k * 4);
		swml_offset_block(sums, m->k, 0u - m->offset * m->cfg->world);
		swml_dequantize_block(sums, len, r->exp, (int)m->L, nf, (float *)m->y + off);
	}
}

/* What the switch answers to world copies of DATA frame f: the RESULT of
 * block b, into its rx frame. */
static void make_result(struct micro *m, uint32_t b, const uint8_t *f)
{
	uint8_t *r = rx_frame(m, b), *ip = r + SWML_ETH_LEN, *udp = ip + SWML_IP_LEN;
	uint8_t *h = r + SWML_L2L4_LEN, *payload = h + SWML_HDR_LEN;
	const uint32_t full = m->cfg->auth == SWML_AUTH_FULL;
	uint64_t tag;

	memcpy(r, f, m->frame_len);
	memcpy(ip + 12, m->addrs.dst_ip, 4);
	memcpy(ip + 16, m->addrs.src_ip, 4);
	memcpy(udp, udp + 2, 2); /* from the switch's port */
	h[offsetof(struct swml_hdr, ver_type)] = (SWML_VERSION << 4) | SWML_TYPE_RESULT;
	for (uint32_t i = 0; i < m->k; i++) {
		if (m->cfg->fmt == SWML_FMT_INT16) {
			int16_t q;
			int32_t s;

			memcpy(&q, payload + 2 * i, 2);
			s = (int32_t)q * (int32_t)m->cfg->world;
			if (m->L)
				s = (s + (1 << (m->L - 1))) >> m->L;
			q = (int16_t)s;
			memcpy(payload + 2 * i, &q, 2);
		} else {
			uint32_t u;

			memcpy(&u, payload + 4 * i, 4);
			u *= m->cfg->world; /* wraps, as the switch's adds */
			memcpy(payload + 4 * i, &u, 4);
		}
	}
	tag = swml_result_tag(h, m->key, m->cfg->auth, full ? m->k * m->esize : 0);
	for (int i = 0; i < 8; i++)
		h[offsetof(struct swml_hdr, key) + i] = (uint8_t)(tag >> (8 * i));
}

static uint32_t one_loop(struct micro *m);

static int setup(struct micro *m, const struct swml_micro_cfg *cfg, const void *x, size_t n,
		 void *y)
{
	const struct swml_addrs addrs = {.src_mac = {2, 0, 0, 0, 0, 1},
					 .dst_mac = {2, 0, 0, 0, 0, 2},
					 .src_ip = {10, 0, 0, 1},
					 .dst_ip = {10, 0, 0, 2},
					 .src_port = SWML_DEFAULT_PORT,
					 .dst_port = SWML_DEFAULT_PORT};
	const uint32_t max_k = cfg->fmt == SWML_FMT_INT16 ? SWML_MAX_K_INT16 : SWML_MAX_K;

	memset(m, 0, sizeof *m);
	if (cfg->k == 0 || cfg->k > max_k || cfg->world == 0 || cfg->world > 0xffff ||
	    cfg->fmt >= SWML_FMT_NUM || cfg->auth > SWML_AUTH_FULL || cfg->passes == 0 || n == 0 ||
	    (n + cfg->k - 1) / cfg->k > UINT32_MAX / 2) {
		errno = EINVAL;
		return -1;
	}
	m->cfg = cfg;
	m->x = x;
	m->y = y;
	m->n = n;
	m->k = cfg->k;
	m->L = (uint32_t)swml_exponent_bits(cfg->world);
	m->blocks = (uint32_t)((n + cfg->k - 1) / cfg->k);
	m->esize = swml_fmt_size(cfg->fmt);
	m->frame_len = SWML_HEADERS_LEN + m->esize * m->k;
	m->quantized = cfg->fmt != SWML_FMT_INT32;
	m->offset = cfg->fmt == SWML_FMT_OFFSET32 ? 1u << (30 - m->L) : 0;
	m->addrs = addrs;
	m->id = (struct swml_data_id){.job = 1,
				      .rank = 0,
				      .count = (uint16_t)m->k,
				      .op = SWML_OP_SUM,
				      .fmt = cfg->fmt,
				      .tag = 0x5eed,
				      .key = 0x0123456789abcdefull};
	m->key[0] = 0x0706050403020100ull;
	m->key[1] = 0x0f0e0d0c0b0a0908ull;
	swml_build_template(m->tmpl, &m->addrs, m->k, cfg->fmt);
	m->lexp = calloc(m->blocks, 1);
	m->lnf = calloc(m->blocks, 1);
	m->res = calloc(m->blocks, sizeof *m->res);
	m->tx = aligned_alloc(4096, (size_t)TX_FRAMES * SWML_XSK_FRAME_SIZE);
	m->rx = aligned_alloc(4096, (size_t)m->blocks * SWML_XSK_FRAME_SIZE);
	if (!m->lexp || !m->lnf || !m->res || !m->tx || !m->rx) {
		errno = ENOMEM;
		return -1;
	}
	for (uint32_t b = 0; b < m->blocks; b++) {
		stage_exponent(m, b);
		stage_quantize(m, b, tx_frame(m, b));
		stage_build(m, b, tx_frame(m, b));
		make_result(m, b, tx_frame(m, b));
	}
	/* the first touch of y's pages is no stage's cost */
	return one_loop(m) ? (errno = EBADMSG, -1) : 0;
}

static void teardown(struct micro *m)
{
	free(m->lexp);
	free(m->lnf);
	free(m->res);
	free(m->tx);
	free(m->rx);
}

/* The stages one after the other for each block, as the engine meets them;
 * the number of RESULTs refused (none, unless the micro is wrong). */
static uint32_t one_loop(struct micro *m)
{
	uint32_t refused = 0;

	for (uint32_t b = 0; b < m->blocks; b++) {
		uint8_t *f = tx_frame(m, b);

		stage_exponent(m, b);
		stage_quantize(m, b, f);
		stage_build(m, b, f);
		if (stage_parse(m, b) || !stage_auth(m, b)) {
			refused++;
			continue;
		}
		stage_dequantize(m, b);
	}
	return refused;
}

/* Each stage alone over all blocks, stage_ns[] added to. */
static uint32_t one_pass_each(struct micro *m, uint64_t *stage_ns)
{
	uint32_t refused = 0;
	uint64_t t[SWML_MICRO_STAGES + 1];

	t[0] = now_ns();
	for (uint32_t b = 0; b < m->blocks; b++)
		stage_exponent(m, b);
	t[1] = now_ns();
	for (uint32_t b = 0; b < m->blocks; b++)
		stage_quantize(m, b, tx_frame(m, b));
	t[2] = now_ns();
	for (uint32_t b = 0; b < m->blocks; b++)
		stage_build(m, b, tx_frame(m, b));
	t[3] = now_ns();
	for (uint32_t b = 0; b < m->blocks; b++)
		refused += stage_parse(m, b) != 0;
	t[4] = now_ns();
	for (uint32_t b = 0; b < m->blocks; b++)
		refused += !stage_auth(m, b);
	t[5] = now_ns();
	for (uint32_t b = 0; b < m->blocks; b++)
		stage_dequantize(m, b);
	t[6] = now_ns();
	for (int s = 0; s < SWML_MICRO_STAGES; s++)
		stage_ns[s] += t[s + 1] - t[s];
	return refused;
}

int swml_engine_micro(const struct swml_micro_cfg *cfg, const void *x, size_t n, void *y,
		      struct swml_micro_result *res)
{
	struct micro m;
	uint32_t refused = 0;
	uint64_t t0;

	memset(res, 0, sizeof *res);
	if (setup(&m, cfg, x, n, y)) {
		teardown(&m);
		return -1;
	}
	for (uint32_t p = 0; p < cfg->passes; p++)
		refused += one_pass_each(&m, res->stage_ns);
	t0 = now_ns();
	for (uint32_t p = 0; p < cfg->passes; p++)
		refused += one_loop(&m);
	res->loop_ns = now_ns() - t0;
	res->packets = (uint64_t)m.blocks * cfg->passes;
	teardown(&m);
	if (refused) {
		errno = EBADMSG; /* a RESULT the micro made did not parse or authenticate */
		return -1;
	}
	return 0;
}
