/* SPDX-License-Identifier: MIT */
/*
 * udp_port.h - the engine's datapath over a kernel UDP socket (the udp
 * backend: no root, no XDP), in the shape of xsk_port.h so that the stream
 * (stream.c) runs over either through port.h.
 *
 * The socket is the caller's (switchml_xdp/client/port.py binds it to the
 * job's port and joins the job's group); the port only reads and writes it.
 *
 * Transmit: the stream writes whole frames (Ethernet | IPv4 | UDP | swml |
 * payload, packet.h) into frames reserved here; a kick sends everything
 * reserved with sendmmsg, the datagram being the frame after its 42-byte
 * Ethernet/IPv4/UDP prefix, to the switch's address and port. Runs of
 * datagrams of one size go as one message with UDP GSO (UDP_SEGMENT, Linux
 * 4.18): the stack takes one skb for up to SWML_UDP_GSO_MAX of them and cuts
 * it into datagrams late (the NIC, or software past the qdisc), as TCP's
 * segments go; where the kernel refuses it, one message a datagram. The prefix's
 * IPv4 TOS is honoured: the socket's IP_TOS follows it (the box's DSCP mark,
 * docs/transport.md), set only when it changes.
 *
 * Receive: recvmmsg into frames that leave room for that prefix, which is
 * then written from what the kernel says of the datagram (its source address
 * and port, its TOS through IP_RECVTOS), so the stream parses a UDP datagram
 * exactly as an AF_XDP frame (packet.h, swml_parse_result).
 */
#ifndef SWML_UDP_PORT_H
#define SWML_UDP_PORT_H

#include <stdint.h>

#include <netinet/in.h>
#include <sys/socket.h>

#define SWML_UDP_FRAME_SIZE 4096u /* > SWML_PAGE_FRAME_LEN, as xsk_port.h's */
#define SWML_UDP_TX_FRAMES 1024u  /* sendmmsg's most (UIO_MAXIOV) */
#define SWML_UDP_RX_BATCH 64u     /* datagrams one recvmmsg takes */
#define SWML_UDP_TX_OFFSET 6u     /* the payload on a 64-byte boundary (xsk_port.h) */
#define SWML_UDP_GSO_MAX 64u      /* datagrams a GSO message (the kernel's UDP_MAX_SEGMENTS) */
#define SWML_UDP_GSO_BYTES 65000u /* and its bytes: one IPv4 datagram's worth */

struct swml_udp {
	int fd; /* the caller's socket: not closed here */
	struct sockaddr_in dst;
	uint8_t *tx_area; /* SWML_UDP_TX_FRAMES frames: a ring of unsent frames */
	uint32_t *tx_len;
	uint32_t tx_head, tx_count; /* the oldest unsent frame, how many */
	int tos;                    /* the socket's IP_TOS as last set (-1: not yet) */
	struct mmsghdr *tx_msgs;
	struct iovec *tx_iov;
	uint32_t *tx_msg_frames; /* frames each message of the last sendmmsg holds */
	uint8_t *tx_ctrl;        /* per message: its UDP_SEGMENT */
	int gso;                 /* 1: send runs with UDP_SEGMENT (0 once the kernel refused) */
	uint8_t *rx_area;        /* SWML_UDP_RX_BATCH frames */
	struct mmsghdr *rx_msgs;
	struct iovec *rx_iov;
	struct sockaddr_in *rx_from;
	uint8_t *rx_ctrl;
	uint64_t kicks, kick_errors, rx_truncated;
	uint64_t gso_sends; /* messages of several datagrams sent with UDP_SEGMENT */
};

/* Use the bound UDP socket fd for datagrams to dst_ip:dst_port (network
 * order address, host order port). 0, or -errno with a message in err. */
int swml_udp_open(struct swml_udp *u, int fd, const uint8_t dst_ip[4], uint16_t dst_port, char *err,
		  size_t errlen);
void swml_udp_close(struct swml_udp *u);

/* A frame for a packet of len bytes (Ethernet header first), or NULL while
 * SWML_UDP_TX_FRAMES are waiting to be sent. */
uint8_t *swml_udp_tx_reserve(struct swml_udp *u, uint32_t len);
/* Frames reserved and not yet sent. */
static inline uint32_t swml_udp_tx_pending(const struct swml_udp *u)
{
	return u->tx_count;
}
/* Send what is reserved, in order; what the socket cannot take now
 * (EAGAIN, ENOBUFS) stays for the next kick. 0 or -errno of a hard error. */
int swml_udp_kick(struct swml_udp *u);

/* Up to max (<= SWML_UDP_RX_BATCH) datagrams as frames: frames[i] and
 * lens[i] valid until the next call. Returns how many (0: none now). */
uint32_t swml_udp_rx(struct swml_udp *u, const uint8_t **frames, uint32_t *lens, uint32_t max);

#endif /* SWML_UDP_PORT_H */
