/* SPDX-License-Identifier: MIT */
/*
 * swml_wire.h - the switchml-xdp wire format, v1. The single definition.
 *
 * One UDP datagram carries one packet of one slot:
 *   Ethernet | IPv4 (no options) | UDP | struct swml_hdr (16 B) | k x int32 (LE)
 *
 * Included by the switch program, the worker redirect program and the worker's
 * C engine. The Python package takes its constants and byte layout from the C
 * compiler's reading of this file (switchml_xdp/layout_gen.py, at build time):
 * keep every constant an object-like `#define SWML_NAME <integer expression>`.
 */
#ifndef SWML_WIRE_H
#define SWML_WIRE_H

#define SWML_VERSION 1

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

/* Per-job limits: the worker bitmap is a u64. */
#define SWML_MAX_WORLD 64
/* Job ids are 1..SWML_MAX_JOBS-1; 0 is never a valid job. */
#define SWML_MAX_JOBS 256

/* Elements per packet: default, and the most that fits a 1500-byte MTU
 * (1500 - 20 IPv4 - 8 UDP - 16 swml = 1456 bytes = 364 int32). */
#define SWML_DEFAULT_K 256
#define SWML_MAX_K 364
#define SWML_DEFAULT_SLOTS 1024

/* Header sizes in bytes (no IP options, no VLAN). */
#define SWML_ETH_LEN 14
#define SWML_IP_LEN 20
#define SWML_UDP_LEN 8
#define SWML_HDR_LEN 16
#define SWML_HEADERS_LEN 58 /* ETH + IP + UDP + swml */

/* Multicast group of job j: 239.77.(j >> 8).(j & 255), MAC 01:00:5e:4d:(j>>8):(j&255). */
#define SWML_MCAST_PREFIX_A 239
#define SWML_MCAST_PREFIX_B 77

/* Reasons the switch drops (or passes) a packet: one counter row each. The
 * names after SWML_CNT_ are what `swml-switch status` prints. */
#define SWML_CNT_RX 0             /* swml packets seen (to our port) */
#define SWML_CNT_AGGREGATED 1     /* added into a slot, not yet complete */
#define SWML_CNT_COMPLETED 2      /* last contribution: multicast RESULT sent */
#define SWML_CNT_SHADOW_REPLY 3   /* retransmission answered from the shadow copy */
#define SWML_CNT_DUP_DROPPED 4    /* retransmission to an incomplete slot */
#define SWML_CNT_PASSED 5         /* not swml: handed to the kernel stack */
#define SWML_CNT_TRUNCATED 6      /* shorter than the headers or than its count */
#define SWML_CNT_BAD_IP 7         /* IP options, fragment, or wrong length */
#define SWML_CNT_BAD_VERSION 8    /* version nibble not SWML_VERSION */
#define SWML_CNT_BAD_TYPE 9       /* type is not DATA */
#define SWML_CNT_UNKNOWN_JOB 10   /* no such job */
#define SWML_CNT_BAD_RANK 11      /* rank >= world */
#define SWML_CNT_BAD_SOURCE 12    /* source IP/port not the one registered for the rank */
#define SWML_CNT_BAD_SLOT 13      /* slot outside the job's range */
#define SWML_CNT_BAD_COUNT 14     /* count != k */
#define SWML_CNT_NUM 15

#ifndef SWML_NO_STRUCTS
/* All multi-byte fields in network byte order. */
struct swml_hdr {
	__u8 ver_type;  /* (SWML_VERSION << 4) | SWML_TYPE_* */
	__u8 flags;     /* SWML_FLAG_* */
	__be16 job;     /* job id from the control plane */
	__be16 rank;    /* worker rank, < world */
	__be16 slot;    /* slot index relative to the job's slot range */
	__be32 seq;     /* packet index in the job's stream; opaque, echoed */
	__s8 exp;       /* block exponent; the switch returns the max */
	__u8 reserved;  /* zero */
	__be16 count;   /* int32 elements in the payload, must equal k */
} __attribute__((packed));
#endif

#endif /* SWML_WIRE_H */
