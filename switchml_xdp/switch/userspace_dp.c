/* SPDX-License-Identifier: MIT */
/*
 * userspace_dp.c - the data plane of the user-space aggregator
 * (switchml_xdp/switch/userspace.py): the switch program xdp/swml_switch.c,
 * re-done as a plain process on a kernel UDP socket.
 *
 * Same semantics, packet for packet: the checks and their counters, and the
 * per-slot step itself, which is not re-written here but compiled from the
 * switch's own xdp/swml_slot.h (two slot versions, each holding one round:
 * the first contribution of a newer round overwrites, a stale one is dropped,
 * SUM/MIN/MAX, exp max, NONFINITE OR, DISAGREE on another tag or op, the
 * result when every rank is in, the shadow reply to a retransmission that
 * finds its round complete). What differs is where it runs: every
 * packet goes through the kernel's IP/UDP receive path into a socket, is read
 * by this loop, and its RESULT goes back down through the UDP send path; that
 * is what XDP saves.
 *
 * The maps are plain memory owned by Python (numpy arrays, see MemoryMaps in
 * userspace.py), which the control plane writes while this loop runs, as it
 * writes BPF maps under the XDP program. One thread, batched: recvmmsg() up to
 * BATCH datagrams, process them in order, sendmmsg() the RESULTs in place.
 *
 * Compiled at first use with the system C compiler (cc -O2 -shared), against
 * xdp/swml_wire.h, the one definition of the wire format, and xdp/swml_slot.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/types.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <arpa/inet.h>

#include "swml_wire.h"
#include "swml_maps.h" /* struct swml_job_stats (the XDP switch's per-job counters) */
#include "swml_auth.h"

#define BATCH 64
#define SWML_L2L4_OVERHEAD (SWML_ETH_LEN + SWML_IP_LEN + SWML_UDP_LEN)
/* A datagram's room: more than the largest (SWML_HDR_LEN + 4 * SWML_MAX_K), so
 * that a longer one reads as longer (and is counted so), not cut to fit. */
#define MAXPKT 4096
_Static_assert(MAXPKT > SWML_HDR_LEN + 4 * SWML_MAX_K, "room for the largest datagram");

/* userspace.py takes the layouts of us_job, us_member and us_state from here
 * (JOB_DTYPE, MEMBER_DTYPE, _State: the compiler's, through layout_gen.py). */
struct us_job {
	uint32_t active;
	uint32_t world;
	uint32_t slot_base;
	uint32_t slot_count;
	uint64_t key;         /* network order, as the header carries it */
	uint32_t group_ip;    /* network order */
	uint16_t result_port; /* network order: lane 0's */
	uint16_t lane_mask;   /* the job's lanes less one (swml_maps.h) */
	__u64 result_key[2];  /* the RESULT authenticator's key (swml_maps.h) */
	uint32_t auth;        /* SWML_AUTH_* */
	uint32_t pad2;
};

struct us_member {
	uint32_t ip;   /* network order */
	uint16_t port; /* network order */
	uint16_t pad;
};

struct us_state {
	uint32_t k;
	uint32_t nslots;
	struct us_job *jobs;              /* [SWML_MAX_JOBS] */
	struct us_member *members;        /* [SWML_MAX_JOBS * SWML_MAX_WORLD] */
	uint64_t *seen;                   /* [nslots][2] */
	uint32_t *seq;                    /* [nslots][2] */
	uint32_t *count;                  /* [nslots][2] */
	uint32_t *tag;                    /* [nslots][2] */
	uint8_t *op;                      /* [nslots][2] */
	int8_t *exp;                      /* [nslots][2] */
	uint8_t *flags;                   /* [nslots][2] */
	int32_t *vals;                    /* [nslots][2][k] */
	uint64_t *counters;               /* [SWML_CNT_NUM] */
	struct swml_job_stats *job_stats; /* [SWML_MAX_JOBS] */
	struct swml_job_pace *job_pace;   /* [SWML_MAX_JOBS]: the control plane's, read */
	uint32_t *job_left;               /* [SWML_MAX_JOBS]: written here (swml_maps.h) */
	volatile uint32_t *stop;          /* non-zero: return */
	uint64_t batches;                 /* recvmmsg calls that returned data */
	uint64_t batched;                 /* datagrams they returned */
};

/* A slot of the arrays above, for the per-slot step (xdp/swml_slot.h). */
struct us_slot {
	struct us_state *st;
	uint32_t index;
};

#define SWML_SLOT_T struct us_slot
#define SWML_SEEN(s, v) ((s).st->seen[(s).index * 2 + (v)])
#define SWML_SEQ(s, v) ((s).st->seq[(s).index * 2 + (v)])
#define SWML_COUNT(s, v) ((s).st->count[(s).index * 2 + (v)])
#define SWML_TAG(s, v) ((s).st->tag[(s).index * 2 + (v)])
#define SWML_OP(s, v) ((s).st->op[(s).index * 2 + (v)])
#define SWML_EXP(s, v) ((s).st->exp[(s).index * 2 + (v)])
#define SWML_FLAGS(s, v) ((s).st->flags[(s).index * 2 + (v)])
#define SWML_VALS(s, v) ((s).st->vals + ((size_t)(s).index * 2 + (v)) * (s).st->k)
#define bpf_htonl(x) htonl(x)
#include "swml_slot.h" /* one thread: no lock */

size_t swml_us_state_size(void)
{
	return sizeof(struct us_state);
}
size_t swml_us_job_size(void)
{
	return sizeof(struct us_job);
}
size_t swml_us_member_size(void)
{
	return sizeof(struct us_member);
}

/* One datagram: 0 = drop it, 1 = multicast RESULT to *to, 2 = unicast (shadow)
 * back to the sender. The RESULT is written in place into buf. */
static int handle(struct us_state *st, uint8_t *buf, int len, const struct sockaddr_in *from,
		  struct sockaddr_in *to)
{
	struct swml_hdr *h = (struct swml_hdr *)buf;
	uint64_t *cnt = st->counters;
	uint32_t k = st->k;
	int fmt16 = len >= SWML_HDR_LEN && h->fmt == SWML_FMT_INT16;
	uint32_t payload_len = (fmt16 ? 2 : 4) * k; /* as the switch program's length checks */

	cnt[SWML_CNT_RX]++;
	if (len < SWML_HDR_LEN) {
		cnt[SWML_CNT_TRUNCATED]++;
		return 0;
	}
	if ((h->ver_type >> 4) != SWML_VERSION) {
		cnt[SWML_CNT_BAD_VERSION]++;
		return 0;
	}
	if ((h->ver_type & 0x0f) != SWML_TYPE_DATA) {
		cnt[SWML_CNT_BAD_TYPE]++;
		return 0;
	}
	if (ntohs(h->count) != k) {
		cnt[SWML_CNT_BAD_COUNT]++;
		return 0;
	}
	if ((uint32_t)len < SWML_HDR_LEN + payload_len) {
		cnt[SWML_CNT_TRUNCATED]++;
		return 0;
	}
	if ((uint32_t)len != SWML_HDR_LEN + payload_len) {
		cnt[SWML_CNT_BAD_IP]++; /* the switch program checks the IP/UDP lengths */
		return 0;
	}
	uint32_t job_id = ntohs(h->job);
	if (job_id >= SWML_MAX_JOBS) {
		cnt[SWML_CNT_UNKNOWN_JOB]++;
		return 0;
	}
	struct us_job *job = &st->jobs[job_id];
	if (!job->active) {
		cnt[SWML_CNT_UNKNOWN_JOB]++;
		return 0;
	}
	if (h->key != job->key) {
		cnt[SWML_CNT_BAD_KEY]++;
		return 0;
	}
	uint32_t rank = ntohs(h->rank), world = job->world;
	if (rank >= world || rank >= SWML_MAX_WORLD) {
		cnt[SWML_CNT_BAD_RANK]++;
		return 0;
	}
	struct us_member *m = &st->members[job_id * SWML_MAX_WORLD + rank];
	uint32_t rel = ntohs(h->slot);
	/* from the rank's port + the slot's lane, as the switch program checks */
	uint16_t lane = rel & job->lane_mask;
	if (m->ip != from->sin_addr.s_addr || from->sin_port != htons(ntohs(m->port) + lane)) {
		cnt[SWML_CNT_BAD_SOURCE]++;
		return 0;
	}
	if (rel >= job->slot_count || job->slot_base + rel >= st->nslots) {
		cnt[SWML_CNT_BAD_SLOT]++;
		return 0;
	}
	if (!swml_op_fmt_ok(h->op, h->fmt)) {
		cnt[SWML_CNT_BAD_OP]++;
		return 0;
	}
	uint32_t ver = h->flags & SWML_FLAG_SLOT_VER;
	struct us_slot slot = {st, job->slot_base + rel};
	struct swml_contrib c = {.seq = ntohl(h->seq),
				 .tag = ntohl(h->tag),
				 .op = h->op,
				 .flags = h->flags,
				 .exp = h->exp,
				 .fmt = h->fmt};
	struct swml_slot_result res = {0};
	int32_t payload[SWML_MAX_K];
	int disagreed = 0;

	memcpy(payload, buf + SWML_HDR_LEN, payload_len); /* unaligned on the wire */
	int outcome = swml_slot_step(slot, ver, 1ULL << rank, world, &c, payload, payload, k, &res,
				     &disagreed);
	cnt[outcome]++;
	if (disagreed)
		cnt[SWML_CNT_DISAGREED]++;
	if (outcome == SWML_CNT_STALE)
		return 0;
	struct swml_job_stats *js = &st->job_stats[job_id];
	js->packets += 1;
	js->bytes += (uint64_t)len + SWML_L2L4_OVERHEAD; /* frame bytes, as the XDP switch counts */
	js->results += outcome == SWML_CNT_COMPLETED;
	js->shadow_replies += outcome == SWML_CNT_SHADOW_REPLY;
	/* what the rank has left of its call, for a box that shares */
	if (st->job_pace[job_id].rate && ntohs(h->pace))
		st->job_left[job_id] = ntohs(h->pace);
	if (outcome == SWML_CNT_AGGREGATED || outcome == SWML_CNT_DUP_DROPPED)
		return 0;

	memcpy(buf + SWML_HDR_LEN, payload, payload_len);
	swml_result_hdr(h, &res, outcome == SWML_CNT_SHADOW_REPLY);
	h->pace = st->job_pace[job_id].rate; /* no DSCP here: `--dscp` needs the xdp data plane */
	h->key = swml_result_auth(job->result_key, job->auth, h,
				  payload_len); /* SipHash's bytes, LE */
	memset(to, 0, sizeof(*to));
	to->sin_family = AF_INET;
	if (outcome == SWML_CNT_SHADOW_REPLY) {
		to->sin_addr = from->sin_addr;
		to->sin_port = from->sin_port;
		return 2;
	}
	to->sin_addr.s_addr = job->group_ip;
	to->sin_port = htons(ntohs(job->result_port) + lane);
	return 1;
}

/* Serve datagrams on fd (a bound UDP socket) until *st->stop. Returns 0, or
 * -errno of a socket call that failed for good. */
int swml_us_run(int fd, struct us_state *st)
{
	static uint8_t bufs[BATCH][MAXPKT];
	struct mmsghdr rx[BATCH], tx[BATCH];
	struct iovec rxiov[BATCH], txiov[BATCH];
	struct sockaddr_in from[BATCH], to[BATCH];
	struct pollfd pfd = {.fd = fd, .events = POLLIN};

	while (!*st->stop) {
		int n = poll(&pfd, 1, 100);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			continue;
		for (;;) {
			for (int i = 0; i < BATCH; i++) {
				rxiov[i].iov_base = bufs[i];
				rxiov[i].iov_len = MAXPKT;
				memset(&rx[i].msg_hdr, 0, sizeof(rx[i].msg_hdr));
				rx[i].msg_hdr.msg_iov = &rxiov[i];
				rx[i].msg_hdr.msg_iovlen = 1;
				rx[i].msg_hdr.msg_name = &from[i];
				rx[i].msg_hdr.msg_namelen = sizeof(from[i]);
			}
			int got = recvmmsg(fd, rx, BATCH, MSG_DONTWAIT, NULL);
			if (got < 0) {
				if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
					break;
				return -errno;
			}
			if (got == 0)
				break;
			st->batches++;
			st->batched += got;
			int out = 0;
			for (int i = 0; i < got; i++) {
				if (!handle(st, bufs[i], (int)rx[i].msg_len, &from[i], &to[out]))
					continue;
				txiov[out].iov_base = bufs[i];
				txiov[out].iov_len = rx[i].msg_len;
				memset(&tx[out].msg_hdr, 0, sizeof(tx[out].msg_hdr));
				tx[out].msg_hdr.msg_iov = &txiov[out];
				tx[out].msg_hdr.msg_iovlen = 1;
				tx[out].msg_hdr.msg_name = &to[out];
				tx[out].msg_hdr.msg_namelen = sizeof(to[out]);
				out++;
			}
			for (int sent = 0; sent < out;) {
				int r = sendmmsg(fd, tx + sent, out - sent, 0);
				if (r < 0) {
					if (errno == EINTR)
						continue;
					/* ENOBUFS and the like: the RESULT is lost, as a frame
					 * can be on a wire; the workers retransmit. */
					sent++;
					continue;
				}
				sent += r;
			}
			if (got < BATCH)
				break;
		}
	}
	return 0;
}
