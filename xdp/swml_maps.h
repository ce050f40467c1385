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
/* A job's way up the tree (docs/scale-out.md, "A tree of boxes"): a rack
 * box whose job has a parent sends each round complete among its own
 * members to the parent, as one member of the parent's job, out of its
 * uplink. All of it from the parent's join reply and the uplink's
 * addresses; ifindex 0: no parent (the RESULT goes to the members). */
struct swml_uplink {
	__u32 ifindex;       /* the uplink port */
	__be32 parent_ip;    /* the parent box's address */
	__be32 src_ip;       /* this box's address on the uplink */
	__be16 parent_port;  /* the parent's data port */
	__be16 src_port;     /* this box's data port there: the parent's RESULTs come to it */
	__u8 parent_mac[6];  /* the next hop towards the parent */
	__u8 src_mac[6];     /* the uplink's MAC */
	__be16 job;          /* the job's id at the parent */
	__be16 rank;         /* this box's rank in the parent's job */
	__u32 auth;          /* the parent job's SWML_AUTH_* */
	__be64 key;          /* the parent job's data key */
	__u64 result_key[2]; /* the parent job's result key: RESULTs from above are checked */
};

struct swml_job {
	__u32 active;
	__u32 world;        /* contributions that complete a round at this box */
	__u32 slot_base;    /* absolute index of the job's slot 0 */
	__u32 slot_count;   /* slots in the job's range */
	__be64 key;         /* the data key every DATA packet of the job carries */
	__be32 group_ip;    /* multicast group of RESULTs */
	__be16 result_port; /* UDP port the workers listen on (lane 0's) */
	__u8 group_mac[6];
	/* The job's lanes less one (a power of two less one: 0 for one lane):
	 * a rank sends slot s's DATA from its port + (s & lane_mask), and the
	 * RESULT goes to result_port + (s & lane_mask) (swml_wire.h). */
	__u16 lane_mask;
	/* The RESULT authenticator's key (swml_wire.h, swml_auth.h): SipHash's
	 * k0, k1, the result key's bytes 0-7 and 8-15 read little-endian. */
	__u64 result_key[2];
	__u32 auth;     /* SWML_AUTH_HEADER or SWML_AUTH_FULL */
	__u32 rank_end; /* one past the highest rank of rank_mask (the fan-out's loop bound) */
	/* Written by the switch program, zero from the control plane: bit p set
	 * once a member's DATA came in on port p of the box (its place in the
	 * port list), the ports a multicast RESULT of the job goes out of. */
	__u64 port_mask;
	/* The ranks that send to this box, bit r = rank r: 0..world-1 for a job
	 * on one box; a rack box's own members, or a parent's children (each by
	 * the lowest rank behind it) and direct members, in a tree. */
	__u64 rank_mask;
	struct swml_uplink up;
};

/* parent_routes[{parent's address, the job's id there}]: the local job a
 * RESULT from a parent box belongs to (written with the job's uplink). */
struct swml_parent_route {
	__be32 parent_ip;
	__u32 parent_job;
};

/* members[job_id * SWML_MAX_WORLD + rank]: the address a rank must send from,
 * where its unicast RESULTs go (--fanout unicast, xdp/swml_fanout.c). */
struct swml_member {
	__be32 ip;
	__u8 mac[6]; /* written by the switch program, not the control plane: the Ethernet
			source of the rank's last DATA packet that passed every check (the
			next hop's MAC where the worker is routed); all zero until then.
			Never from the join's `mac` field, which nobody vouches for. */
	__be16 port;
	/* Learnt with `mac`, from the same packet: the box's port it came in on
	 * (its ifindex, and its place in the box's port list), where the rank's
	 * unicast RESULTs go out on a box with several ports. */
	__u32 ifindex;
	__u32 port_index;
};

/* The ports of one box (`swml-switch up eth1 eth2 ...`): at most this many. */
#define SWML_MAX_PORTS 8

/* port_stats[0] (per CPU): what each port of the box carried of the switch's
 * own traffic, by its place in the port list: DATA in (every frame to us, as
 * counted under SWML_CNT_RX), RESULTs and shadow replies out. */
struct swml_port_stats {
	__u64 rx_packets[SWML_MAX_PORTS];
	__u64 rx_bytes[SWML_MAX_PORTS];
	__u64 tx_packets[SWML_MAX_PORTS];
	__u64 tx_bytes[SWML_MAX_PORTS];
};

/* --fanout unicast: what the switch program (XDP) leaves in a completed RESULT's
 * metadata (bpf_xdp_adjust_meta) for the tc fan-out program, which copies the
 * RESULT to every member of `job`. Only XDP on this host can write metadata, so
 * a frame from the network cannot ask for a fan-out; the magic tells ours from
 * metadata another XDP program might leave. */
#define SWML_FANOUT_META_MAGIC 0x53574d4c /* "SWML" */
struct swml_fanout_meta {
	__u32 magic;
	__u32 job;
};

/* job_stats[job_id] (per CPU): what the data plane did for a job, cumulative
 * since the control plane zeroed the row when the job started. */
struct swml_job_stats {
	__u64 packets;        /* DATA packets that passed every check and reached a slot */
	__u64 bytes;          /* their frame bytes */
	__u64 results;        /* rounds completed (one RESULT to the members each) */
	__u64 shadow_replies; /* retransmissions answered from a completed round */
};

/* job_pace[job_id]: the job's part of the box under `swml-switch up --share`,
 * written by the control plane (switchml_xdp/switch/shares.py) and stamped
 * into every RESULT of the job (swml_wire.h, "pace"); all zero without shares. */
struct swml_job_pace {
	__be16 rate; /* pace code: the kbit/s each rank may send to this box; 0: no limit */
	__u8 tos;    /* the IPv4 TOS of the job's RESULTs (DSCP << 2), where `mark` */
	__u8 mark;   /* 1: set the RESULTs' TOS to `tos` (`--dscp`) */
};

/* In a slot version's flags (never on the wire): the round's result came
 * down from the parent box. Until then a round complete at a rack box holds
 * its partial sum, which goes up again for a member's retransmission. */
#define SWML_SLOT_FINAL 0x80

/* slots[i]: two versions of one aggregation slot, updated under its lock word.
 * Version v holds one round at a time: the round whose packets carry seq[v].
 * seen[v] == 0 means never used (the control plane zeroes a job's slots); a
 * packet with a newer seq starts a new round there (swml_slot.h). */
#ifdef SWML_K
struct swml_slot {
	__u64 busy;     /* the slot's lock: 1 while a packet's step holds it (swml_switch.c) */
	__u64 seen[2];  /* worker bitmaps, bit r = rank r contributed */
	__u32 seq[2];   /* the current round: seq of its packets (host order) */
	__u32 count[2]; /* contributions to it; world = complete */
	__u32 tag[2];   /* call tag of its first contribution (host order) */
	__u8 op[2];     /* its op (SWML_OP_*) */
	__s8 exp[2];    /* max block exponent over contributions */
	__u8 flags[2];  /* OR of contributors' NONFINITE, and DISAGREE; SWML_SLOT_FINAL */
	/* A rack box (a tree of boxes): the member whose DATA completed the
	 * round here, which the RESULT from above names when this box's
	 * partial completed the parent's round (swml_tree.h); */
	__u8 up_rank[2];
	/* and when the round's partial last went up to the parent
	 * (bpf_ktime_get_ns), so that a wave of members' retransmissions sends
	 * it up once (SWML_UP_HOLD_NS). */
	__u64 up_ns[2];
	__s32 vals[2][SWML_K];
};
#endif

#endif /* SWML_MAPS_H */
