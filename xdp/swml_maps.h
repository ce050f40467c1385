/* SPDX-License-Identifier: MIT */
/*
 * swml_maps.h - layout of the switch's BPF map values, shared by the switch
 * program and the control plane (switchml_xdp/switch/maps.py gets these
 * structs from switchml_xdp/layout.py, generated from the C compiler's reading).
 *
 * SWML_K (elements a packet) is a compile-time define: the slot size depends on it.
 */
#ifndef SWML_MAPS_H
#define SWML_MAPS_H

/* jobs[job_id]: what the data plane needs to know of a job. Written by the
 * control plane at join, cleared at leave/abort. active == 0 means no job. */
struct swml_job {
	__u32 active;
	__u32 world;        /* ranks 0..world-1 */
	__u32 slot_base;    /* absolute index of the job's slot 0 */
	__u32 slot_count;   /* slots in the job's range */
	__be32 group_ip;    /* multicast group of RESULTs */
	__be16 result_port; /* UDP port the workers listen on */
	__u8 group_mac[6];
};

/* members[job_id * SWML_MAX_WORLD + rank]: the address a rank must send from. */
struct swml_member {
	__be32 ip;
	__be16 port;
	__u16 pad;
};

/* slots[i]: two versions of one aggregation slot, updated under the lock.
 * count[v] runs modulo world: 0 means "complete (or never used)", so the first
 * contribution of a round is the one that finds count 0 and its rank unseen. */
#ifdef SWML_K
struct swml_slot {
	struct bpf_spin_lock lock; /* 4 bytes */
	__u32 pad0;
	__u64 seen[2];  /* worker bitmaps, bit r = rank r contributed */
	__u32 count[2];
	__s8 exp[2];    /* max block exponent over contributions */
	__u8 flags[2];  /* OR of contributors' SWML_FLAG_NONFINITE */
	__u32 pad1;
	__s32 vals[2][SWML_K];
};
#endif

#endif /* SWML_MAPS_H */
