/* SPDX-License-Identifier: MIT */
/*
 * swml_wire.h - the switchml-xdp wire format, v2. The single definition.
 *
 * One UDP datagram carries one packet of one slot:
 *   Ethernet | IPv4 (no options) | UDP | struct swml_hdr (32 B) | k x int32 (LE)
 *
 * Included by the switch program, the worker redirect program and the worker's
 * C engine. The Python package takes its constants and byte layout from the C
 * compiler's reading of this file (switchml_xdp/layout_gen.py, at build time):
 * keep every constant an object-like `#define SWML_NAME <integer expression>`.
 * docs/protocol.md explains each field and what the switch checks.
 */
#ifndef SWML_WIRE_H
#define SWML_WIRE_H

#define SWML_VERSION 2

/* Default UDP ports: data (SwitchML's 0xBEE0) and the control protocol (TCP). */
#define SWML_DEFAULT_PORT 48864
#define SWML_DEFAULT_CONTROL_PORT 48865

/* ver_type: version in the high nibble, type in the low nibble. */
#define SWML_TYPE_DATA 1   /* worker -> switch: one contribution */
#define SWML_TYPE_RESULT 2 /* switch -> workers: the aggregate */

/* flags */
#define SWML_FLAG_SLOT_VER 0x01  /* which of the slot's two versions */
#define SWML_FLAG_RETRANS 0x02   /* the worker sent this packet before */
#define SWML_FLAG_NONFINITE 0x04 /* some input of this block was NaN/Inf */
#define SWML_FLAG_SHADOW 0x08    /* a unicast re-send of a completed result */
/* RESULT: contributions of this round carried different call tags or ops; the
 * result is meaningless. */
#define SWML_FLAG_DISAGREE 0x10 /* DATA from a rack box: its members' round disagreed */
/* RESULT: the round completed, but its payload went to the round's owner only
 * (--fanout unicast and a DATA `owner`, a reduce_scatter's shard): the frame
 * ends after the swml header (count is still k), its authenticator covers
 * the header alone whatever the job's auth mode, and a worker takes it only
 * for a packet that is not its own shard's (docs/protocol.md, "Shards"). */
#define SWML_FLAG_HEADER_ONLY 0x20

/* op: how contributions of one round combine (int32 in the switch). */
#define SWML_OP_SUM 0 /* wrapping two's complement sum */
#define SWML_OP_MIN 1 /* signed minimum */
#define SWML_OP_MAX 2 /* signed maximum */
#define SWML_OP_NUM 3

/* fmt: the payload format, k elements of it. */
#define SWML_FMT_INT32 0 /* little-endian int32 */
/* Little-endian int16, SUM only: the switch adds them into its int32 slot and
 * returns (sum + 2^(L-1)) >> L, L = ceil(log2(world)) (docs/quantization.md,
 * "The 16-bit format"). */
#define SWML_FMT_INT16 1
/* Little-endian uint32 in offset binary, SUM only: the sender adds 2^(30-L) to
 * each quantized int32 (|q| <= 2^(30-L)), so that every element is in
 * [0, 2^(31-L)] and world <= 2^L of them sum below 2^32: the switch adds two
 * elements at once with one u64 add, no carry crossing between them; receivers
 * subtract world * 2^(30-L) (docs/quantization.md, "Offset binary"). Float32
 * sums at 32 bits travel so. */
#define SWML_FMT_OFFSET32 2
#define SWML_FMT_NUM 3

/* Rounds: seq is the packet's index in the job's stream, modulo 2^32; every
 * rank sends the same seq for the same (slot, round). The switch keeps the seq
 * of each slot version's current round and compares in serial number
 * arithmetic (RFC 1982): seq - current, as an int32, > 0 is a newer round,
 * < 0 a stale packet. A stream may therefore run through the wrap of seq, and
 * a replayed packet is told apart from a new one until the job has sent
 * 2^31 more packets. Workers restart a job's stream after a failed call this
 * far ahead (every rank alike), past anything the call may have sent: */
#define SWML_SEQ_RESYNC_STRIDE 0x1000000 /* 2^24 packets: also the most one call may send */

/* Per-job limits: the worker bitmap is a u64. */
#define SWML_MAX_WORLD 64
/* Job ids are 1..SWML_MAX_JOBS-1; 0 is never a valid job. */
#define SWML_MAX_JOBS 256
/* Lanes (docs/performance.md, "Several queues per worker"): a job's stream
 * may be split into Q lanes, Q a power of two up to this that divides the
 * job's slots; packet i of the job's stream is lane i mod Q's, so slot s is
 * lane s mod Q's. A rank sends lane q's DATA from its port + q and gets its
 * RESULTs there: the one field a NIC's queue steering and the kernel's socket
 * lookup both see. */
#define SWML_MAX_LANES 16

/* Elements per packet (k). The default fits a 1500-byte MTU, as does k up to
 * SWML_MTU1500_K (1500 - 20 IPv4 - 8 UDP - 32 swml = 1440 bytes = 360 int32).
 * Larger k needs a larger MTU: a packet of k elements is an IPv4 datagram of
 * SWML_IP_OVERHEAD + 4k bytes (docs/performance.md, "Larger frames"). */
#define SWML_DEFAULT_K 256
#define SWML_MTU1500 1500
#define SWML_IP_OVERHEAD 60 /* IPv4 20 + UDP 8 + swml 32: the MTU a packet needs, less 4k */
#define SWML_MTU1500_K ((SWML_MTU1500 - SWML_IP_OVERHEAD) / 4)
/* The most k: the largest frame native XDP takes in one page, without
 * fragments (XDP multi-buffer is not used): 4096 - 256 (XDP_PACKET_HEADROOM)
 * - 320 (sizeof(struct skb_shared_info) on x86-64, 6.1 to 6.18) = 3520 bytes
 * (veth's limit, MTU 3506), less the 12-byte header virtio_net keeps in the
 * same receive buffer (6.1 drops a larger frame, though it takes MTU 3506):
 * 3508 bytes, MTU 3494, which ena (3498) and veth take too. So
 * (3494 - 60) / 4 = 858 int32, a 3506-byte frame. An AF_XDP frame
 * (worker/xsk_port.h) is then one page too. */
#define SWML_PAGE_FRAME_LEN 3520
#define SWML_VNET_HDR_LEN 12
#define SWML_MAX_MTU (SWML_PAGE_FRAME_LEN - SWML_VNET_HDR_LEN - SWML_ETH_LEN)
#define SWML_MAX_K ((SWML_MAX_MTU - SWML_IP_OVERHEAD) / 4)
/* k is one per switch, whatever the format; an int16 packet of k elements is
 * k x 2 payload bytes, and the most int16 elements that would fit the largest
 * frame (engine_micro's bound) is: */
#define SWML_MAX_K_INT16 ((SWML_MAX_MTU - SWML_IP_OVERHEAD) / 2)
#define SWML_DEFAULT_SLOTS 1024

/* Header sizes in bytes (no IP options, no VLAN). */
#define SWML_ETH_LEN 14
#define SWML_IP_LEN 20
#define SWML_UDP_LEN 8
#define SWML_HDR_LEN 32
#define SWML_HEADERS_LEN 74 /* ETH + IP + UDP + swml */

/* Multicast group of job j: 239.77.(j >> 8).(j & 255), MAC 01:00:5e:4d:(j>>8):(j&255). */
#define SWML_MCAST_PREFIX_A 239
#define SWML_MCAST_PREFIX_B 77

/* What the switch did with a packet: one counter row each. The names after
 * SWML_CNT_ are what `swml-switch status` prints. Rows from SWML_CNT_TRUNCATED
 * on are the reasons a packet was dropped before it reached a slot. */
#define SWML_CNT_RX 0           /* swml DATA packets seen (to our port and address) */
#define SWML_CNT_AGGREGATED 1   /* added into a slot, not yet complete */
#define SWML_CNT_COMPLETED 2    /* last contribution: RESULT sent to the job's members */
#define SWML_CNT_SHADOW_REPLY 3 /* retransmission answered from the shadow copy */
#define SWML_CNT_DUP_DROPPED 4  /* retransmission to an incomplete slot */
#define SWML_CNT_PASSED 5       /* not swml: handed to the kernel stack */
#define SWML_CNT_OTHER_HOST 6   /* to our port but not to our MAC and IP: passed */
#define SWML_CNT_DISAGREED 7    /* also counted above: another tag or op than its round's */
/* --fanout unicast (xdp/swml_fanout.c): the completed RESULT goes to each member
 * as a copy of its own. Outside the rx sum, as DISAGREED is. */
#define SWML_CNT_UNICAST_COPIES 8        /* unicast copies of RESULTs sent, one per member */
#define SWML_CNT_UNICAST_NO_MAC 9        /* a member without a learnt MAC yet: no copy for it */
#define SWML_CNT_UNICAST_CLONE_FAILED 10 /* the kernel refused a copy (bpf_clone_redirect) */
/* The driver could not carry the RESULT to the fan-out (no XDP metadata room):
 * nobody got it. */
#define SWML_CNT_UNICAST_NO_META 11
/* of the copies above, those without the payload (SWML_FLAG_HEADER_ONLY): one
 * to every member of a round that has an owner, after the owner's whole one */
#define SWML_CNT_UNICAST_HEADER_ONLY 12
/* A tree of boxes (docs/scale-out.md): what a rack box did with a round
 * complete among its members (counted besides COMPLETED and SHADOW_REPLY),
 * and with the parent's RESULTs (not DATA: outside the rx sum). */
#define SWML_CNT_SENT_UP 13 /* the round's partial sent to the parent, one member there */
/* a member's retransmission, not yet answered from above: the partial again */
#define SWML_CNT_RESENT_UP 14
/* a member's retransmission that came less than SWML_UP_HOLD_NS after the
 * partial went up (xdp/swml_tree.h): not sent up again */
#define SWML_CNT_UP_HELD 15
#define SWML_CNT_FROM_PARENT 16 /* the parent's RESULT for it, sent on to the members */
/* a RESULT from the parent for a round already answered (a copy): dropped */
#define SWML_CNT_PARENT_COPY 17
/* from a parent's address and job, but not its RESULT (authenticator, ports,
 * length, round): dropped */
#define SWML_CNT_BAD_PARENT 18
#define SWML_CNT_TRUNCATED 19   /* shorter than the headers or than its count */
#define SWML_CNT_BAD_IP 20      /* IP options, fragment, or wrong length */
#define SWML_CNT_BAD_VERSION 21 /* version nibble not SWML_VERSION */
#define SWML_CNT_BAD_TYPE 22    /* type is not DATA */
#define SWML_CNT_UNKNOWN_JOB 23 /* no such job */
#define SWML_CNT_BAD_KEY 24     /* not the job's data key */
#define SWML_CNT_BAD_RANK 25    /* not a rank that sends to this box */
#define SWML_CNT_BAD_SOURCE 26  /* source IP/port not the one registered for the rank */
#define SWML_CNT_BAD_SLOT 27    /* slot outside the job's range */
#define SWML_CNT_BAD_COUNT 28   /* count != k */
#define SWML_CNT_BAD_OP 29      /* op or format unknown, or int16 into a tree */
#define SWML_CNT_STALE 30       /* a round older than the slot version's (replay, late copy) */
#define SWML_CNT_BUSY 31        /* the slot stayed locked by another CPU (a stalled holder) */
#define SWML_CNT_NUM 32

/* RESULT authenticator (the `key` field of a RESULT): SipHash-c-d keyed by
 * the job's 128-bit result key, which only the switch and the job's members
 * hold (told in the join reply; never on the wire), over the RESULT's header
 * bytes before `key` and, where the job authenticates payloads, the payload
 * as sent. Stored as SipHash's 8 output bytes (the u64, little-endian).
 * xdp/swml_auth.h computes it; docs/security.md says what each mode defends. */
#define SWML_AUTH_HDR_LEN 24 /* header bytes covered: all before `key` */
#define SWML_AUTH_HEADER 0   /* the header only */
#define SWML_AUTH_FULL 1     /* the header and the payload */
#define SWML_SIP_C_ROUNDS 2  /* compression rounds a word */
#define SWML_SIP_D_ROUNDS 4  /* finalisation rounds */
#define SWML_RESULT_KEY_LEN 16

/* The `pace` field: a job's share of the box (docs/protocol.md, "Pace").
 * A value v >= 0 in 16 bits as (e << SWML_PACE_MANT_BITS) | m, v = m << e,
 * m < 2^SWML_PACE_MANT_BITS: exact below 2048, else within 1/1024, up to
 * 2047 << 31. Zero: nothing said (a worker or box without shares).
 * DATA: the payload bytes this rank has yet to send to this box in its
 * current call, this packet's included (srpt serves the least first).
 * RESULT: the rate the receiving rank may send to this box, in kbit/s of
 * Ethernet frames (headers included). The RESULT's IPv4 DSCP is the job's
 * mark (`swml-switch up --dscp`): a rank sends its DATA to the box with the
 * DSCP of the box's last RESULT. */
#define SWML_PACE_MANT_BITS 11
#define SWML_PACE_MANT_MASK ((1 << SWML_PACE_MANT_BITS) - 1)
#define SWML_PACE_EXP_MAX 31

#ifndef SWML_NO_STRUCTS
/* All multi-byte fields in network byte order. */
struct swml_hdr {
	__u8 ver_type; /* (SWML_VERSION << 4) | SWML_TYPE_* */
	__u8 flags;    /* SWML_FLAG_* */
	__u8 op;       /* SWML_OP_*: equal for every contribution to a round */
	__u8 fmt;      /* SWML_FMT_*: the payload's format */
	__be16 job;    /* job id from the control plane */
	__be16 rank;   /* worker rank, < world */
	__be16 slot;   /* slot index relative to the job's slot range */
	__be16 count;  /* elements in the payload, must equal k */
	__be32 seq;    /* packet index in the job's stream mod 2^32: the round */
	__be32 tag;    /* call tag: equal for every contribution to a round */
	__s8 exp;      /* block exponent; the switch returns the max */
	__u8 owner;    /* 0, or 1 + the rank keeping the sum (a shard) */
	__be16 pace;   /* DATA: the call's bytes left; RESULT: the rank's rate (SWML_PACE_*) */
	__be64 key;    /* DATA: the job's data key from the join; RESULT: its authenticator */
} __attribute__((packed));
#endif

#endif /* SWML_WIRE_H */
