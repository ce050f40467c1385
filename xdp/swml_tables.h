/* SPDX-License-Identifier: MIT */
/*
 * swml_tables.h - the switch's pinned maps, declared once for the two programs
 * that share them: the XDP switch (swml_switch.c) and, with --fanout unicast,
 * the tc fan-out (swml_fanout.c). Both are compiled with the same defines, so
 * they name the same pins; whichever bcc loads second opens the first one's
 * maps (bcc re-uses a pin that exists).
 *
 * BPF C through bcc only; include after swml_wire.h and swml_maps.h. bcc rewrites
 * map calls (`counters.lookup()`) only in the main source file, so helpers that
 * make them (swml_count) live in each program, not here.
 */
#ifndef SWML_TABLES_H
#define SWML_TABLES_H

#ifndef SWML_K
#error "SWML_K must be defined"
#endif
#ifndef SWML_SLOTS
#error "SWML_SLOTS must be defined"
#endif
#ifndef SWML_PIN_DIR
#error "SWML_PIN_DIR must be defined"
#endif

/* Pinned: `status`, `down` and a restarted daemon open them by path; a reload
 * on the same interface re-uses them (bcc opens an existing pin). */
BPF_TABLE_PINNED("array", u32, struct swml_job, jobs, SWML_MAX_JOBS, SWML_PIN_DIR "/jobs");
BPF_TABLE_PINNED("array", u32, struct swml_member, members, (SWML_MAX_JOBS * SWML_MAX_WORLD),
		 SWML_PIN_DIR "/members");
BPF_TABLE_PINNED("array", u32, struct swml_slot, slots, SWML_SLOTS, SWML_PIN_DIR "/slots");
BPF_TABLE_PINNED("percpu_array", u32, u64, counters, SWML_CNT_NUM, SWML_PIN_DIR "/counters");
BPF_TABLE_PINNED("percpu_array", u32, struct swml_job_stats, job_stats, SWML_MAX_JOBS,
		 SWML_PIN_DIR "/job_stats");
BPF_TABLE_PINNED("percpu_array", u32, struct swml_port_stats, port_stats, 1,
		 SWML_PIN_DIR "/port_stats");
BPF_TABLE_PINNED("array", u32, struct swml_job_pace, job_pace, SWML_MAX_JOBS,
		 SWML_PIN_DIR "/job_pace");
/* job_left[job_id]: the pace code of the job's last DATA that passed every
 * check and said one: what its rank had left of its call (swml_wire.h);
 * written by the switch program only, read by the control plane's srpt. */
BPF_TABLE_PINNED("array", u32, u32, job_left, SWML_MAX_JOBS, SWML_PIN_DIR "/job_left");
BPF_TABLE_PINNED("hash", struct swml_parent_route, u32, parent_routes, SWML_MAX_JOBS,
		 SWML_PIN_DIR "/parent_routes");

/* The box's ports (swml_maps.h): SWML_PORTS of them, compiled in by the
 * control plane (switchml_xdp/switch/xdp_dataplane.py); one unless it says more. */
#ifndef SWML_PORTS
#define SWML_PORTS 1
#endif
#if SWML_PORTS < 1 || SWML_PORTS > SWML_MAX_PORTS
#error "SWML_PORTS must be 1 .. SWML_MAX_PORTS"
#endif

#endif /* SWML_TABLES_H */
