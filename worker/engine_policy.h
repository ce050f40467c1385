/* SPDX-License-Identifier: MIT */
/*
 * engine_policy.h - the numbers the worker's policies share between Python
 * and the engine, written once. switchml_xdp/layout_gen.py reads every SWML_*
 * define of this header into switchml_xdp/_layout.py at build time, where
 * switchml_xdp/client/retransmit.py and afxdp_backend.py take them
 * (docs/architecture.md, "Where Python gets the C layouts"). Integer defines
 * and nothing else: the layout generator compiles this header without the
 * engine's libraries.
 */
#ifndef SWML_ENGINE_POLICY_H
#define SWML_ENGINE_POLICY_H

/* The afxdp engine's default retransmission timeouts, in microseconds
 * (retransmit.ENGINE_POLICY). The engine turns a packet around in about a
 * microsecond and a window's round trip in the lab is ~1 ms: measured round
 * trips let it retransmit within a few ms, and the 2 ms floor keeps a peer
 * that is descheduled for a moment (4 workers sharing 2 cores) from costing
 * whole windows of spurious resends (a fixed 5 ms timer resent ~7% of
 * packets). docs/design-decisions.md, "One retransmission policy", has the
 * measurements. */
#define SWML_RTO_INITIAL_US 5000
#define SWML_RTO_MIN_US 2000
#define SWML_RTO_MAX_US 500000

/* The timer rules of both backends (retransmit.py's docstring says why): an
 * expired timer's timeout is multiplied by SWML_RTO_BACKOFF, up to the max;
 * RESULTs have stopped (a rank is late, not a packet lost) when none came in
 * for the RTO / SWML_RTO_QUIET_DIV, far longer than they are apart while they
 * flow. */
#define SWML_RTO_BACKOFF 2
#define SWML_RTO_QUIET_DIV 8

/* The probe whose timer runs out again (its resend was lost too) goes as
 * copies, back to back: 2^(n-1) at its n-th expiry, at most
 * SWML_RTO_COPIES_MAX. A run of losses (a burst, while the probe is all the
 * stream sends) then ends in a few timeouts, not one doubled timeout a lost
 * frame; QUIC's probe timeout sends two datagrams for the same reason (RFC
 * 9002, 6.2.4). Only the probe: copies of every packet deferred behind it
 * would make a late rank's stall cost copies of the window. A copy that
 * finds its round complete is a duplicate at the box (docs/transport.md,
 * "Bursts: copies of a lost probe"). */
#define SWML_RTO_COPIES_MAX 4

/* Loss by evidence (RACK, RFC 8985): a packet in flight is lost once a
 * packet sent more than the smoothed round trip / SWML_RACK_REORDER_DIV
 * after it has its RESULT. No packet of a later round overtakes one of an
 * earlier round on a rank's path, but a box runs rounds on several CPUs at
 * once, and one CPU's softirq may wait behind another task: RACK's quarter of
 * the minimum round trip resent 0.13% of a loss-free job's packets in the
 * lab (4 ranks on 2 cores, 1 Gbit/s), a quarter of the smoothed one 0.03%. */
#define SWML_RACK_REORDER_DIV 4

/* That margin adapts, as RACK's reordering window does (RFC 8985, 6.2). A
 * second RESULT of a packet resent on evidence (TCP's DSACK) says the resend
 * was for nothing: the original's RESULT was only late (RESULTs reordered
 * by more than the margin: a path over several queues, docs/performance.md,
 * "Several queues per worker"), or another rank's resend completed the
 * round first (a loss, not reordering: about half of a rank's resends for
 * another's lost packet come so). So the resends on evidence are judged in
 * samples of this many: where at least 3/4 were answered twice the margin
 * grows by a quarter of the smoothed round trip, up to the whole of it;
 * where at most 1/4 were, it is a quarter again. */
#define SWML_RACK_REO_SAMPLE 16

/* The n-th resend of a packet on evidence waits 2^n round trips after the
 * last (stream.c, rack_detect: the round may wait for a late rank), n at
 * most this. */
#define SWML_RACK_MAX_BACKOFF 6

/* A call fails when no result came in for this long, in seconds (the
 * Worker's and every backend's default stall_timeout). */
#define SWML_STALL_TIMEOUT_S 30

/* Empty rx-ring polls (~10 us each) before the engine sleeps in ppoll().
 * Results of a worker's own packets come back inside its own sendto() (copy
 * mode runs the whole veth/bridge/switch path in that call's softirq), so
 * spinning only helps for results that other workers complete; on 2 shared
 * cores a long spin (20000) halved 4-worker goodput by starving the peers it
 * was waiting for. Only while RESULTs come close together, or have not
 * come yet: see below. */
#define SWML_ENGINE_SPIN 200

/* How the engine waits while RESULTs trickle in (stream.c, "waiting"): it
 * spins only while RESULTs come less than SWML_SPIN_MAX_GAP_NS apart (a
 * sleep and a wake cost about that much), and while they come at least
 * SWML_COALESCE_MIN_GAP_NS apart (a shaped or paced link, not the cores, is
 * the limit) with the window full, it sleeps on a timer, deaf to the socket,
 * until about SWML_ENGINE_COALESCE of them are waiting, at most the smoothed
 * round trip / SWML_COALESCE_RTT_DIV: one wake and one kick a batch instead of
 * one a RESULT, as a NIC moderates its interrupts. Measured in the lab (2
 * ranks, 200 Mbit/s, 32-packet queues): the ranks' CPU a GiB fell from 64 to
 * 43 s with the same TAT (docs/performance.md, "Waiting for RESULTs").
 * SWML_ENGINE_COALESCE 0 turns it off. */
#define SWML_ENGINE_COALESCE 8
#define SWML_SPIN_MAX_GAP_NS 20000
#define SWML_COALESCE_MIN_GAP_NS 5000
#define SWML_COALESCE_RTT_DIV 4

#endif /* SWML_ENGINE_POLICY_H */
