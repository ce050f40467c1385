/* SPDX-License-Identifier: MIT */
/*
 * engine_micro.h - the engine's per-packet work with no network, timed stage
 * by stage (docs/performance.md, "Where the engine's cycles go").
 *
 * Each block of k elements goes through what stream.c does to it: its local
 * exponent (send_new), quantize into a tx frame (build), the frame's headers
 * (build), then, on the way back, parse and authenticate its RESULT (rx_batch)
 * and dequantize it into the output (on_result). The RESULTs are made before
 * the clock starts, by the switch's arithmetic on world copies of this
 * rank's DATA, so the output is what an allreduce of world copies of x gives
 * (quant.simulate_allreduce, quant16.simulate_allreduce16, an int32 sum).
 * Rings, kicks and the switch itself are not in it: the lab's benches have them.
 */
#ifndef SWML_ENGINE_MICRO_H
#define SWML_ENGINE_MICRO_H

#include <stddef.h>
#include <stdint.h>

enum swml_micro_stage {
	SWML_MICRO_EXPONENT,   /* swml_block_exponent */
	SWML_MICRO_QUANTIZE,   /* the payload: quantize (+ offset), or a copy for int32 */
	SWML_MICRO_BUILD,      /* template copy and swml_write_data_hdr */
	SWML_MICRO_PARSE,      /* swml_parse_result */
	SWML_MICRO_AUTH,       /* swml_result_authentic */
	SWML_MICRO_DEQUANTIZE, /* aligned copy, offset off, dequantize (or a copy) */
	SWML_MICRO_STAGES
};

/* Each stage's name, as the bench prints it. */
extern const char *const swml_micro_stage_names[SWML_MICRO_STAGES];

struct swml_micro_cfg {
	uint32_t k;      /* elements a packet, <= SWML_MAX_K (SWML_MAX_K_INT16 for int16) */
	uint32_t world;  /* ranks: sets L and the RESULTs' sums */
	uint8_t fmt;     /* SWML_FMT_OFFSET32 or SWML_FMT_INT16 (a float32 SUM),
			  * SWML_FMT_INT32 (an int32 SUM) */
	uint32_t auth;   /* SWML_AUTH_HEADER or SWML_AUTH_FULL */
	uint32_t passes; /* times over the tensor, each way */
	int one_pass;    /* 0: the calls stream.c makes (the RESULT's payload copied
			  * to an aligned buffer, the offset a pass of its own);
			  * 1: quant.h's one-pass calls, reading the payload in place */
};

struct swml_micro_result {
	uint64_t packets;                     /* blocks x passes, each way */
	uint64_t stage_ns[SWML_MICRO_STAGES]; /* each stage alone, a pass over all blocks */
	uint64_t loop_ns;                     /* the stages one packet after the other */
};

/* Run it over the n elements at x (float32, or int32 for SWML_FMT_INT32),
 * the last loop's output at y (n elements of the same type). 0, or -1 with
 * errno EINVAL (a bad cfg) or ENOMEM. */
int swml_engine_micro(const struct swml_micro_cfg *cfg, const void *x, size_t n, void *y,
		      struct swml_micro_result *res);

#endif /* SWML_ENGINE_MICRO_H */
