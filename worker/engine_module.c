/* SPDX-License-Identifier: MIT */
/*
 * engine_module.c - switchml_xdp._engine: the Python face of the C engine.
 *
 *   Engine(ifname, xskmap_fd, abort, job=, rank=, world=, k=, slots=,
 *          src_mac=, dst_mac=, src_ip=, dst_ip=, src_port=, dst_port=,
 *          key=, seq_base=, queue=0, frames=4096, rto_initial=, rto_min=,
 *          rto_max=, stall_timeout=, spin=, rto_adaptive=True,
 *          window=WindowPolicy tuple, coalesce=, udp_fd=-1, udp_gso=True)
 *     (udp_fd >= 0: over that bound kernel UDP socket instead, the udp
 *     backend's, with ifname "" and xskmap_fd -1: udp_port.h; the caller
 *     keeps the socket open while the engine is, and closes it; udp_gso:
 *     runs of datagrams as UDP GSO messages where the kernel takes them.
 *     udp_fd with an AF_XDP socket: RESULTs that the NIC put on another
 *     queue come in there (stats()["stray_results"]), and while the AF_XDP
 *     socket is in copy mode the sends go through udp_fd unless udp_tx is
 *     False: port.h; stats()["udp_tx"] says whether they do)
 *     (the rto_* are a switchml_xdp.client.retransmit.RetransmitPolicy; their,
 *     stall_timeout's, spin's and coalesce's defaults are engine_policy.h's; window a
 *     switchml_xdp.client.window.WindowPolicy.as_tuple(); key and
 *     seq_base the join's; dst_* the switch: RESULTs come only from there)
 *     .wake()                      a running allreduce reads the abort flag now
 *     .rebind(queue)               between calls: the AF_XDP socket moves to that
 *                                   rx queue (port.h, swml_port_rebind)
 *     .stray_results               stats()["stray_results"], without the rest
 *     .allreduce(array, op, tag, fmt, shard=0) -> status  whole tensor, GIL
 *                                   released; OK/ABORTED/STALLED/DISAGREE/E2BIG/...;
 *                                   fmt SWML_FMT_INT16: the 16-bit format,
 *                                   SWML_FMT_OFFSET32: int32 in offset binary
 *                                   (float32 SUM only); shard > 0: a
 *                                   reduce_scatter's elements per rank, only
 *                                   this rank's shard of the output is sure
 *                                   to hold the result (stream.h)
 *     .pending_slots() -> list      slots still waiting when the last call failed
 *     .stats() -> dict              counters (packets_sent, retransmissions, ...)
 *     .next_index                   packets of the job's life so far
 *     .fd                           the AF_XDP (or UDP) socket
 *     .close()
 *   block_exponents(x, k, exp_out, nonfinite_out)
 *   quantize(x, k, exp_global, world, out)
 *   dequantize(sums, exp_global, nonfinite_any, world, out)
 *   quantize16(x, k, exp_global, out: int16)  the 16-bit format (quant16.py)
 *   dequantize16(results: int16, exp_global, nonfinite_any, world, out)
 *   exponent_bits(world)
 *   ordered(x: float32, op, out: int32)       float32 MIN/MAX map (ordered.py)
 *   unordered(q: int32, out: float32)         its inverse
 *   packets(n, k, slots, is_float, op)        packets of a call (plans.py)
 *   shard_owner(p, n, k, lag, shard, world)   packet p's owner byte (plans.shard_owners)
 *   window_trace(slots, window, events)       window.c on a list of events, for
 *                                             tests against window.py
 *   pace_encode(value), pace_decode(code)     packet.c's pace codes (wire.py's)
 *   raw_pingpong(ifname, xskmap_fd, abort, ...)  the path's ceiling: frames through the
 *                                             reflector and back (raw_path.h)
 *   engine_micro(x, y, k, world, fmt, auth, passes, one_pass)  the per-packet
 *                                             work with no network, timed (engine_micro.h)
 *   quant_simd(level=-1)                      quantization's vector kernels (quant.h)
 * The quant functions mirror switchml_xdp/quant.py, quant16.py and ordered.py so tests
 * can compare them bit for bit. All arrays go through the buffer protocol (any C-contiguous
 * buffer: numpy arrays, bytearray, memoryview), no numpy C API.
 * `abort` is a writable buffer of at least 4 bytes; a nonzero first word stops
 * a running allreduce (the Python side raises JobAborted): at once after
 * .wake(), within SLEEP_MAX_NS (50 ms, worker/stream.c) without.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <net/if.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "engine_micro.h"
#include "engine_policy.h"
#include "port.h"
#include "quant.h"
#include "raw_path.h"
#include "stream.h"

typedef struct {
	PyObject_HEAD
	struct swml_port port;
	struct swml_stream stream;
	Py_buffer abort_buf;
	int wake_fd; /* an eventfd: wake() ends a running call's sleep (stream.h) */
	int open;
	int busy;
	char ifname[IF_NAMESIZE]; /* the AF_XDP socket's interface and map (rebind) */
	int xskmap_fd;
} EngineObject;

/* ------------------------------------------------------------ buffer helpers */

/* The element type a buffer's format names, ignoring a native/little-endian
 * byte-order prefix (every host here is little-endian). */
static char buf_kind(const Py_buffer *b)
{
	const char *f = b->format ? b->format : "B";

	if (*f == '@' || *f == '=' || *f == '<')
		f++;
	if (f[0] && !f[1])
		return f[0];
	return 0;
}

static int get_buf(PyObject *obj, Py_buffer *b, int writable, const char *kinds, int itemsize,
		   const char *what)
{
	int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
	char kind;

	if (PyObject_GetBuffer(obj, b, flags) < 0)
		return -1;
	kind = buf_kind(b);
	if (b->itemsize != itemsize || !kind || !strchr(kinds, kind)) {
		PyErr_Format(PyExc_TypeError,
			     "%s: expected a C-contiguous buffer of %s, got format '%s'", what,
			     itemsize == 4   ? (strchr(kinds, 'f') ? "float32" : "int32")
			     : itemsize == 2 ? "int16"
					     : "int8/bool",
			     b->format ? b->format : "B");
		PyBuffer_Release(b);
		return -1;
	}
	return 0;
}

static Py_ssize_t buf_len(const Py_buffer *b)
{
	return b->len / b->itemsize;
}

static int check_world(long world)
{
	if (world < 1 || world > 65536) {
		PyErr_Format(PyExc_ValueError, "world must be in [1, 65536], got %ld", world);
		return -1;
	}
	return 0;
}

/* ------------------------------------------------------------ quant functions */

static PyObject *py_exponent_bits(PyObject *self, PyObject *args)
{
	long world;

	if (!PyArg_ParseTuple(args, "l", &world) || check_world(world))
		return NULL;
	return PyLong_FromLong(swml_exponent_bits((uint32_t)world));
}

static PyObject *py_block_exponents(PyObject *self, PyObject *args)
{
	PyObject *xo, *eo, *no;
	Py_ssize_t k;
	Py_buffer x, e, nf;
	PyObject *ret = NULL;

	if (!PyArg_ParseTuple(args, "OnOO", &xo, &k, &eo, &no))
		return NULL;
	if (k < 1)
		return PyErr_Format(PyExc_ValueError, "k must be positive");
	if (get_buf(xo, &x, 0, "f", 4, "x"))
		return NULL;
	if (get_buf(eo, &e, 1, "b", 1, "exp_out"))
		goto out_x;
	if (get_buf(no, &nf, 1, "?bB", 1, "nonfinite_out"))
		goto out_e;
	{
		Py_ssize_t n = buf_len(&x), nb = (n + k - 1) / k;

		if (e.len != nb || nf.len != nb) {
			PyErr_Format(PyExc_ValueError, "need %zd blocks in the outputs", nb);
			goto out;
		}
		Py_BEGIN_ALLOW_THREADS
		for (Py_ssize_t b = 0; b < nb; b++) {
			Py_ssize_t m = n - b * k < k ? n - b * k : k;
			int bad;

			((int8_t *)e.buf)[b] =
				swml_block_exponent((const float *)x.buf + b * k, m, &bad);
			((uint8_t *)nf.buf)[b] = (uint8_t)bad;
		}
		Py_END_ALLOW_THREADS
	}
	ret = Py_NewRef(Py_None);
out:
	PyBuffer_Release(&nf);
out_e:
	PyBuffer_Release(&e);
out_x:
	PyBuffer_Release(&x);
	return ret;
}

/* quantize(x, k, exp_global, world, out: int32[nb*k]) (quant.quantize), or with
 * bits16 quantize16(x, k, exp_global, out: int16[nb*k]) (quant16.quantize16). */
static PyObject *quantize_buffers(PyObject *args, int bits16)
{
	PyObject *xo, *eo, *oo;
	Py_ssize_t k;
	long world = 1;
	Py_buffer x, e, o;
	PyObject *ret = NULL;
	int too_big = 0;

	if (bits16 ? !PyArg_ParseTuple(args, "OnOO", &xo, &k, &eo, &oo)
		   : !PyArg_ParseTuple(args, "OnOlO", &xo, &k, &eo, &world, &oo))
		return NULL;
	if (k < 1)
		return PyErr_Format(PyExc_ValueError, "k must be positive");
	if (check_world(world))
		return NULL;
	if (get_buf(xo, &x, 0, "f", 4, "x"))
		return NULL;
	if (get_buf(eo, &e, 0, "b", 1, "exp_global"))
		goto out_x;
	if (get_buf(oo, &o, 1, bits16 ? "h" : "i", bits16 ? 2 : 4, "out"))
		goto out_e;
	{
		Py_ssize_t n = buf_len(&x), nb = (n + k - 1) / k;
		int L = swml_exponent_bits((uint32_t)world);
		/* the largest |q| each format allows (quant.py, quant16.py) */
		uint32_t limit = bits16 ? 1u << 14 : 1u << (30 - L);

		if (e.len != nb || buf_len(&o) != nb * k) {
			PyErr_Format(PyExc_ValueError, "need %zd exponents and %zd outputs", nb,
				     nb * k);
			goto out;
		}
		Py_BEGIN_ALLOW_THREADS
		for (Py_ssize_t b = 0; b < nb; b++) {
			Py_ssize_t m = n - b * k < k ? n - b * k : k;
			const float *xb = (const float *)x.buf + b * k;
			int16_t *o16 = (int16_t *)o.buf + b * k;
			int32_t *o32 = (int32_t *)o.buf + b * k;
			int8_t eg = ((int8_t *)e.buf)[b];
			int bad;

			if (eg >= swml_block_exponent(xb, m, &bad)) {
				if (bits16)
					swml_quantize16_block(xb, m, k, eg, o16);
				else
					swml_quantize_block(xb, m, k, eg, L, o32);
			} else {
				too_big |=
					(bits16 ? swml_quantize16_block_checked(xb, m, k, eg, o16)
						: swml_quantize_block_checked(xb, m, k, eg, L,
									      o32)) > limit;
			}
		}
		Py_END_ALLOW_THREADS
		if (too_big) {
			PyErr_Format(PyExc_ValueError,
				     "exp_global is smaller than a block's local exponent: "
				     "values would not fit the %s",
				     bits16 ? "int16 payload" : "int32 headroom");
			goto out;
		}
	}
	ret = Py_NewRef(Py_None);
out:
	PyBuffer_Release(&o);
out_e:
	PyBuffer_Release(&e);
out_x:
	PyBuffer_Release(&x);
	return ret;
}

static PyObject *py_quantize(PyObject *self, PyObject *args)
{
	return quantize_buffers(args, 0);
}

static PyObject *py_quantize16(PyObject *self, PyObject *args)
{
	return quantize_buffers(args, 1);
}

/* dequantize(sums: int32[nb*k], exp_global, nonfinite_any, world, out)
 * (quant.dequantize), or with bits16 dequantize16(results: int16[nb*k], ...)
 * (quant16.dequantize16). */
static PyObject *dequantize_buffers(PyObject *args, int bits16)
{
	const char *what = bits16 ? "results" : "sums";
	PyObject *so, *eo, *fo, *oo;
	long world;
	Py_buffer s, e, f, o;
	PyObject *ret = NULL;

	if (!PyArg_ParseTuple(args, "OOOlO", &so, &eo, &fo, &world, &oo))
		return NULL;
	if (check_world(world))
		return NULL;
	if (get_buf(so, &s, 0, bits16 ? "h" : "i", bits16 ? 2 : 4, what))
		return NULL;
	if (get_buf(eo, &e, 0, "b", 1, "exp_global"))
		goto out_s;
	if (get_buf(fo, &f, 0, "?bB", 1, "nonfinite_any"))
		goto out_e;
	if (get_buf(oo, &o, 1, "f", 4, "out"))
		goto out_f;
	{
		Py_ssize_t nb = e.len, n = buf_len(&o), k;
		int L = swml_exponent_bits((uint32_t)world);

		if (nb == 0 || f.len != nb || buf_len(&s) % nb) {
			PyErr_Format(PyExc_ValueError,
				     "%s must be nblocks * k %s, with one "
				     "exponent and one flag per block",
				     what, bits16 ? "int16" : "int32");
			goto out;
		}
		k = buf_len(&s) / nb;
		if (!((nb - 1) * k < n && n <= nb * k)) {
			PyErr_Format(PyExc_ValueError, "n=%zd does not fit %zd blocks of %zd", n,
				     nb, k);
			goto out;
		}
		Py_BEGIN_ALLOW_THREADS
		for (Py_ssize_t b = 0; b < nb; b++) {
			Py_ssize_t m = n - b * k < k ? n - b * k : k;
			int8_t eg = ((int8_t *)e.buf)[b];
			int nf = ((uint8_t *)f.buf)[b] != 0;
			float *y = (float *)o.buf + b * k;

			if (bits16)
				swml_dequantize16_block((const int16_t *)s.buf + b * k, m, eg, L,
							nf, y);
			else
				swml_dequantize_block((const int32_t *)s.buf + b * k, m, eg, L, nf,
						      y);
		}
		Py_END_ALLOW_THREADS
	}
	ret = Py_NewRef(Py_None);
out:
	PyBuffer_Release(&o);
out_f:
	PyBuffer_Release(&f);
out_e:
	PyBuffer_Release(&e);
out_s:
	PyBuffer_Release(&s);
	return ret;
}

static PyObject *py_dequantize(PyObject *self, PyObject *args)
{
	return dequantize_buffers(args, 0);
}

static PyObject *py_dequantize16(PyObject *self, PyObject *args)
{
	return dequantize_buffers(args, 1);
}

/* One direction of the float32 MIN/MAX map over whole buffers: float32 ->
 * int32 with op (SWML_OP_MIN/MAX), or int32 -> float32 for op < 0. */
static PyObject *map_buffers(PyObject *io, PyObject *oo, int op)
{
	const char *in_kind = op < 0 ? "i" : "f", *out_kind = op < 0 ? "f" : "i";
	Py_buffer in, out;
	PyObject *ret = NULL;

	if (get_buf(io, &in, 0, in_kind, 4, "input"))
		return NULL;
	if (get_buf(oo, &out, 1, out_kind, 4, "out")) {
		PyBuffer_Release(&in);
		return NULL;
	}
	if (buf_len(&out) != buf_len(&in)) {
		PyErr_SetString(PyExc_ValueError, "out must have as many elements as the input");
	} else {
		if (op < 0)
			swml_unordered_block(in.buf, buf_len(&in), out.buf);
		else
			swml_ordered_block(in.buf, buf_len(&in), buf_len(&in), (uint8_t)op,
					   out.buf);
		ret = Py_NewRef(Py_None);
	}
	PyBuffer_Release(&out);
	PyBuffer_Release(&in);
	return ret;
}

static PyObject *py_ordered(PyObject *self, PyObject *args)
{
	PyObject *xo, *oo;
	unsigned char op;

	if (!PyArg_ParseTuple(args, "ObO", &xo, &op, &oo))
		return NULL;
	if (op != SWML_OP_MIN && op != SWML_OP_MAX)
		return PyErr_Format(PyExc_ValueError,
				    "the order-preserving map is for MIN and MAX, "
				    "not op %d",
				    op);
	return map_buffers(xo, oo, op);
}

static PyObject *py_unordered(PyObject *self, PyObject *args)
{
	PyObject *qo, *oo;

	if (!PyArg_ParseTuple(args, "OO", &qo, &oo))
		return NULL;
	return map_buffers(qo, oo, -1);
}

static PyObject *py_packets(PyObject *self, PyObject *args)
{
	unsigned long long n;
	unsigned int k, slots, lanes = 1;
	int is_float;
	unsigned char op;

	if (!PyArg_ParseTuple(args, "KIIpb|I", &n, &k, &slots, &is_float, &op, &lanes))
		return NULL;
	if (k < 1 || slots < 1 || lanes < 1)
		return PyErr_Format(PyExc_ValueError, "k, slots and lanes must be positive");
	return PyLong_FromUnsignedLongLong(
		swml_stream_packets(n, k, slots, lanes, is_float ? SWML_FLOAT32 : SWML_INT32, op));
}

/* shard_owner(p, n, k, lag, shard, world): swml_shard_owner, for tests
 * against its Python twin (plans.shard_owners). */
static PyObject *py_shard_owner(PyObject *self, PyObject *args)
{
	unsigned long long p, n, lag, shard;
	unsigned int k, world;

	if (!PyArg_ParseTuple(args, "KKIKKI", &p, &n, &k, &lag, &shard, &world))
		return NULL;
	if (k < 1 || world < 1 || world > SWML_MAX_WORLD)
		return PyErr_Format(PyExc_ValueError,
				    "shard_owner: k must be positive and world in [1, %d]",
				    SWML_MAX_WORLD);
	return PyLong_FromLong(swml_shard_owner(p, n, k, lag, shard, world));
}

/* pace_encode(value), pace_decode(code): packet.c's pace codes, for tests
 * against switchml_xdp/wire.py's. */
static PyObject *py_pace_encode(PyObject *self, PyObject *args)
{
	unsigned long long v;

	if (!PyArg_ParseTuple(args, "K", &v))
		return NULL;
	return PyLong_FromLong(swml_pace_encode(v));
}

static PyObject *py_pace_decode(PyObject *self, PyObject *args)
{
	unsigned int code;

	if (!PyArg_ParseTuple(args, "I", &code))
		return NULL;
	if (code > 0xffff)
		return PyErr_Format(PyExc_ValueError, "pace_decode: a 16-bit code, not %u", code);
	return PyLong_FromUnsignedLongLong(swml_pace_decode((uint16_t)code));
}

/* result_tag(result_key, hdr, auth, payload_len): the authenticator a RESULT
 * whose swml header (and payload after it) is in hdr must carry. The udp
 * backend checks RESULTs with it, fake switches in tests sign with it. */
static PyObject *py_result_tag(PyObject *self, PyObject *args)
{
	const char *key;
	Py_ssize_t key_len;
	Py_buffer hdr;
	unsigned int auth, payload_len;
	uint64_t k[2], tag;

	if (!PyArg_ParseTuple(args, "y#y*II", &key, &key_len, &hdr, &auth, &payload_len))
		return NULL;
	if (key_len != SWML_RESULT_KEY_LEN || auth > SWML_AUTH_FULL ||
	    hdr.len < SWML_HDR_LEN + (Py_ssize_t)(auth == SWML_AUTH_FULL ? payload_len : 0)) {
		PyBuffer_Release(&hdr);
		return PyErr_Format(
			PyExc_ValueError,
			"result_tag: a %d-byte key, auth 0 or 1, and a header followed by "
			"payload_len bytes under full auth",
			SWML_RESULT_KEY_LEN);
	}
	memcpy(k, key, sizeof(k)); /* little-endian words, as the data planes keep them */
	tag = swml_result_tag(hdr.buf, k, auth, payload_len);
	PyBuffer_Release(&hdr);
	return PyLong_FromUnsignedLongLong(tag);
}

/* quant_simd(level=-1) -> the level in use (quant.h's swml_quant_simd). */
static PyObject *py_quant_simd(PyObject *self, PyObject *args)
{
	int level = -1;

	if (!PyArg_ParseTuple(args, "|i", &level))
		return NULL;
	return PyLong_FromLong(swml_quant_simd(level < 0 ? -1 : level));
}

/* engine_micro(x, y, k, world, fmt, auth, passes, one_pass) -> {"packets",
 * "loop_ns", stage: ns}: engine_micro.h's loop over x (float32, int32 for
 * SWML_FMT_INT32) into y (the same), GIL released. */
static PyObject *py_engine_micro(PyObject *self, PyObject *args)
{
	PyObject *xo, *yo, *ret = NULL;
	Py_buffer x, y;
	unsigned int k, world, fmt, auth, passes;
	int one_pass;
	struct swml_micro_result res;
	int rc;

	if (!PyArg_ParseTuple(args, "OOIIIIIp", &xo, &yo, &k, &world, &fmt, &auth, &passes,
			      &one_pass))
		return NULL;
	if (get_buf(xo, &x, 0, fmt == SWML_FMT_INT32 ? "i" : "f", 4, "x"))
		return NULL;
	if (get_buf(yo, &y, 1, fmt == SWML_FMT_INT32 ? "i" : "f", 4, "y"))
		goto out_x;
	if (y.len != x.len) {
		PyErr_SetString(PyExc_ValueError, "engine_micro: y must be as long as x");
		goto out;
	}
	{
		const struct swml_micro_cfg cfg = {.k = k,
						   .world = world,
						   .fmt = fmt < SWML_FMT_NUM ? fmt : SWML_FMT_NUM,
						   .auth = auth,
						   .passes = passes,
						   .one_pass = one_pass};

		Py_BEGIN_ALLOW_THREADS
		rc = swml_engine_micro(&cfg, x.buf, (size_t)buf_len(&x), y.buf, &res);
		Py_END_ALLOW_THREADS
	}
	if (rc) {
		PyErr_Format(errno == ENOMEM ? PyExc_MemoryError : PyExc_ValueError,
			     "engine_micro: %s (k <= MAX_K, world in [1, 65535], a known fmt "
			     "and auth, passes >= 1, x not empty)",
			     strerror(errno));
		goto out;
	}
	ret = Py_BuildValue("{s:K,s:K}", "packets", (unsigned long long)res.packets, "loop_ns",
			    (unsigned long long)res.loop_ns);
	for (int s = 0; ret && s < SWML_MICRO_STAGES; s++) {
		PyObject *v = PyLong_FromUnsignedLongLong(res.stage_ns[s]);

		if (!v || PyDict_SetItemString(ret, swml_micro_stage_names[s], v) < 0)
			Py_CLEAR(ret);
		Py_XDECREF(v);
	}
out:
	PyBuffer_Release(&y);
out_x:
	PyBuffer_Release(&x);
	return ret;
}

/* ------------------------------------------------------------------- Engine */

static int bytes_arg(PyObject *o, uint8_t *dst, Py_ssize_t len, const char *what)
{
	char *p;
	Py_ssize_t n;

	if (PyBytes_AsStringAndSize(o, &p, &n) < 0)
		return -1;
	if (n != len) {
		PyErr_Format(PyExc_ValueError, "%s must be %zd bytes, got %zd", what, len, n);
		return -1;
	}
	memcpy(dst, p, len);
	return 0;
}

/* WindowPolicy.as_tuple(): (enabled, initial, ai, beta, max_mdf,
 * target_backlog, pace_burst, random_loss_md, max_backlog, target_delay_s). None: no window (all the slots
 * at once, no pacing); the numbers are window.py's alone. */
static int window_arg(PyObject *obj, struct swml_window_policy *w)
{
	*w = (struct swml_window_policy){
		.enabled = 0, .initial = 1, .ai = 1, .beta = 1, .max_mdf = 0.5, .pace_burst = 1};
	if (!obj || obj == Py_None)
		return 0;
	if (!PyTuple_Check(obj)) {
		PyErr_SetString(PyExc_TypeError, "window must be WindowPolicy.as_tuple()");
		return -1;
	}
	if (!PyArg_ParseTuple(obj, "pddddddddd", &w->enabled, &w->initial, &w->ai, &w->beta,
			      &w->max_mdf, &w->target_backlog, &w->pace_burst, &w->random_loss_md,
			      &w->max_backlog, &w->target_delay_s))
		return -1;
	if (!(w->initial >= 1) || !(w->ai > 0) || !(w->beta > 0) || !(w->max_mdf > 0) ||
	    !(w->max_mdf < 1) || !(w->target_backlog >= 0) || !(w->pace_burst >= 1) ||
	    !(w->random_loss_md >= 0) || !(w->random_loss_md < 1) ||
	    !(w->max_backlog >= w->target_backlog) || !(w->target_delay_s >= 0)) {
		PyErr_SetString(PyExc_ValueError, "window: parameter out of range");
		return -1;
	}
	return 0;
}

/* window_trace(slots, window, events) -> [(cwnd, srtt, next_send, limit, gap,
 * rate_bound)] after each event: ("ack", rtt, now), ("loss", now), ("sent",
 * now) or ("rate", bits_per_s, frame_bits). */
static PyObject *py_window_trace(PyObject *self, PyObject *args)
{
	unsigned int slots;
	PyObject *wobj, *events, *out, *seq;
	struct swml_window_policy pol;
	struct swml_window w;

	if (!PyArg_ParseTuple(args, "IOO", &slots, &wobj, &events) || window_arg(wobj, &pol))
		return NULL;
	if (slots < 1) {
		PyErr_SetString(PyExc_ValueError, "slots must be >= 1");
		return NULL;
	}
	seq = PySequence_Fast(events, "events must be a sequence");
	if (!seq)
		return NULL;
	out = PyList_New(0);
	if (!out)
		goto fail;
	swml_window_init(&w, slots, &pol);
	for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
		PyObject *ev = PySequence_Fast_GET_ITEM(seq, i), *row;
		const char *kind;
		double a = 0, b = 0;

		if (!PyArg_ParseTuple(ev, "sd|d", &kind, &a, &b))
			goto fail;
		if (!strcmp(kind, "ack"))
			swml_window_ack(&w, a, b);
		else if (!strcmp(kind, "loss"))
			swml_window_loss(&w, a, b != 0.0);
		else if (!strcmp(kind, "sent"))
			swml_window_sent(&w, a);
		else if (!strcmp(kind, "rate"))
			swml_window_set_rate(&w, a, b);
		else {
			PyErr_Format(PyExc_ValueError, "unknown window event %s", kind);
			goto fail;
		}
		row = Py_BuildValue("(dddIdi)", w.cwnd, w.srtt, w.next_send, swml_window_limit(&w),
				    swml_window_gap(&w), swml_window_rate_bound(&w));
		if (!row || PyList_Append(out, row) < 0) {
			Py_XDECREF(row);
			goto fail;
		}
		Py_DECREF(row);
	}
	Py_DECREF(seq);
	return out;
fail:
	Py_DECREF(seq);
	Py_XDECREF(out);
	return NULL;
}

static int Engine_init(EngineObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"ifname",      "xskmap_fd",
				 "abort",       "job",
				 "rank",        "world",
				 "k",           "slots",
				 "src_mac",     "dst_mac",
				 "src_ip",      "dst_ip",
				 "src_port",    "dst_port",
				 "key",         "seq_base",
				 "queue",       "frames",
				 "rto_initial", "rto_min",
				 "rto_max",     "stall_timeout",
				 "spin",        "rto_adaptive",
				 "window",      "result_key",
				 "auth",        "coalesce",
				 "udp_fd",      "udp_gso",
				 "lanes",       "lane",
				 "udp_tx",      NULL};
	const char *ifname;
	int xskmap_fd;
	PyObject *abort_obj, *src_mac = NULL, *dst_mac = NULL, *src_ip = NULL, *dst_ip = NULL;
	const unsigned int unset = 0xffffffffu;
	unsigned int job = unset, rank = unset, world = unset, k = unset, slots = unset;
	unsigned int src_port = unset, dst_port = unset, queue = 0, frames = 4096;
	unsigned long long key = 0;
	unsigned int seq_base = 0;
	PyObject *key_obj = NULL, *seq_base_obj = NULL;
	unsigned int spin = SWML_ENGINE_SPIN, coalesce = SWML_ENGINE_COALESCE;
	int rto_adaptive = 1;
	PyObject *window_obj = NULL, *result_key = NULL;
	unsigned int auth = SWML_AUTH_HEADER;
	int udp_fd = -1, udp_gso = 1, udp_tx = 1;
	unsigned int lanes = 1, lane = 0;
	double rto_initial = SWML_RTO_INITIAL_US / 1e6, rto_min = SWML_RTO_MIN_US / 1e6;
	double rto_max = SWML_RTO_MAX_US / 1e6, stall_timeout = SWML_STALL_TIMEOUT_S;
	struct swml_stream_cfg cfg = {0};
	struct swml_port_cfg port_cfg;
	char err[256];
	int ret;

	if (self->open) {
		PyErr_SetString(PyExc_RuntimeError, "Engine already initialised");
		return -1;
	}
	if (!PyArg_ParseTupleAndKeywords(args, kw, "siO|$IIIIISSSSIIOOIIddddIpOSIIipIIp", kwlist,
					 &ifname, &xskmap_fd, &abort_obj, &job, &rank, &world, &k,
					 &slots, &src_mac, &dst_mac, &src_ip, &dst_ip, &src_port,
					 &dst_port, &key_obj, &seq_base_obj, &queue, &frames,
					 &rto_initial, &rto_min, &rto_max, &stall_timeout, &spin,
					 &rto_adaptive, &window_obj, &result_key, &auth, &coalesce,
					 &udp_fd, &udp_gso, &lanes, &lane, &udp_tx))
		return -1;
	if (window_arg(window_obj, &cfg.window))
		return -1;
	if (job == unset || rank == unset || world == unset || k == unset || slots == unset ||
	    src_port == unset || dst_port == unset || !src_mac || !dst_mac || !src_ip || !dst_ip ||
	    !key_obj || !seq_base_obj || !result_key) {
		PyErr_SetString(
			PyExc_TypeError,
			"Engine: job, rank, world, k, slots, src_mac, dst_mac, "
			"src_ip, dst_ip, src_port, dst_port, key, seq_base and result_key are "
			"required keywords");
		return -1;
	}
	/* Full 64- and 32-bit ranges, checked (the "K"/"I" formats would wrap). */
	key = PyLong_AsUnsignedLongLong(key_obj);
	if (PyErr_Occurred())
		return -1;
	{
		unsigned long sb = PyLong_AsUnsignedLong(seq_base_obj);

		if (PyErr_Occurred())
			return -1;
		if (sb > 0xffffffffUL) {
			PyErr_SetString(PyExc_ValueError, "Engine: seq_base must fit 32 bits");
			return -1;
		}
		seq_base = (unsigned int)sb;
	}
	if (job < 1 || job > 65535 || rank >= world || world < 1 || world > SWML_MAX_WORLD ||
	    k < 1 || k > SWML_MAX_K || slots < 1 || slots > 65535 || src_port > 65535 ||
	    dst_port > 65535 || !(rto_min > 0) || !(rto_initial >= rto_min) ||
	    !(rto_max >= rto_initial) || !(stall_timeout > 0) || auth > SWML_AUTH_FULL ||
	    lanes < 1 || lanes > SWML_MAX_LANES || (lanes & (lanes - 1)) || slots % lanes ||
	    lane >= lanes) {
		PyErr_SetString(PyExc_ValueError, "Engine: parameter out of range");
		return -1;
	}
	cfg.job = (uint16_t)job;
	cfg.rank = (uint16_t)rank;
	cfg.world = world;
	cfg.k = k;
	cfg.slots = slots;
	cfg.lanes = lanes;
	cfg.lane = lane;
	cfg.key = key;
	cfg.seq_base = seq_base;
	cfg.addrs.src_port = (uint16_t)src_port;
	cfg.addrs.dst_port = (uint16_t)dst_port;
	cfg.auth = auth;
	if (bytes_arg(result_key, (uint8_t *)cfg.result_key, SWML_RESULT_KEY_LEN, "result_key") ||
	    bytes_arg(src_mac, cfg.addrs.src_mac, 6, "src_mac") ||
	    bytes_arg(dst_mac, cfg.addrs.dst_mac, 6, "dst_mac") ||
	    bytes_arg(src_ip, cfg.addrs.src_ip, 4, "src_ip") ||
	    bytes_arg(dst_ip, cfg.addrs.dst_ip, 4, "dst_ip"))
		return -1;
	cfg.rto_init_ns = (uint64_t)(rto_initial * 1e9);
	cfg.rto_min_ns = (uint64_t)(rto_min * 1e9);
	cfg.rto_max_ns = (uint64_t)(rto_max * 1e9);
	cfg.rto_adaptive = (uint8_t)rto_adaptive;
	cfg.stall_ns = (uint64_t)(stall_timeout * 1e9);
	cfg.spin = spin;
	cfg.coalesce = coalesce;

	if (PyObject_GetBuffer(abort_obj, &self->abort_buf, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) <
	    0)
		return -1;
	if (self->abort_buf.len < 4 || ((uintptr_t)self->abort_buf.buf & 3)) {
		PyBuffer_Release(&self->abort_buf);
		PyErr_SetString(PyExc_ValueError, "abort must be a writable, 4-byte aligned buffer "
						  "of at least 4 bytes");
		return -1;
	}
	cfg.abort = (const volatile uint32_t *)self->abort_buf.buf;
	self->wake_fd = cfg.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (self->wake_fd < 0) {
		PyBuffer_Release(&self->abort_buf);
		PyErr_SetFromErrno(PyExc_OSError);
		return -1;
	}

	/* udp_fd alone: the udp backend's datapath. Beside an AF_XDP socket
	 * (xskmap_fd): where strays come in, and the way its sends go while it
	 * is in copy mode, unless udp_tx is 0 (port.h). */
	port_cfg = (struct swml_port_cfg){.ifname = ifname,
					  .queue = queue,
					  .frames = frames,
					  .xskmap_fd = xskmap_fd,
					  .udp_fd = udp_fd,
					  .udp_gso = udp_gso,
					  .udp_tx = udp_tx,
					  .dst_port = cfg.addrs.dst_port};
	memcpy(port_cfg.dst_ip, cfg.addrs.dst_ip, 4);
	Py_BEGIN_ALLOW_THREADS
	ret = swml_port_open(&self->port, &port_cfg, err, sizeof err);
	Py_END_ALLOW_THREADS
	if (ret) {
		PyBuffer_Release(&self->abort_buf);
		close(self->wake_fd);
		errno = -ret;
		PyErr_Format(PyExc_OSError, "%s", err);
		return -1;
	}
	snprintf(self->ifname, sizeof self->ifname, "%s", ifname);
	self->xskmap_fd = xskmap_fd;
	if (swml_stream_init(&self->stream, &cfg, &self->port)) {
		swml_port_close(&self->port);
		PyBuffer_Release(&self->abort_buf);
		close(self->wake_fd);
		PyErr_NoMemory();
		return -1;
	}
	self->open = 1;
	return 0;
}

static void engine_close(EngineObject *self)
{
	if (!self->open)
		return;
	self->open = 0;
	swml_stream_free(&self->stream);
	swml_port_close(&self->port);
	PyBuffer_Release(&self->abort_buf);
	close(self->wake_fd);
	self->wake_fd = -1;
}

static void Engine_dealloc(EngineObject *self)
{
	engine_close(self);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static int check_usable(EngineObject *self)
{
	if (!self->open) {
		PyErr_SetString(PyExc_ValueError, "the engine is closed");
		return -1;
	}
	if (self->busy) {
		PyErr_SetString(PyExc_RuntimeError, "the engine is busy with another allreduce "
						    "(calls must not overlap)");
		return -1;
	}
	return 0;
}

static PyObject *Engine_allreduce(EngineObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"array", "op", "tag", "fmt", "shard", NULL};
	PyObject *arg, *shard_obj = NULL;
	unsigned char op, fmt;
	unsigned long tag;
	struct swml_call call;
	Py_buffer b;
	char kind;
	int status;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "Obkb|O", kwlist, &arg, &op, &tag, &fmt,
					 &shard_obj))
		return NULL;
	if (op >= SWML_OP_NUM || tag > 0xffffffffUL || fmt >= SWML_FMT_NUM)
		return PyErr_Format(PyExc_ValueError, "allreduce: op must be an SWML_OP_*, tag "
						      "fit 32 bits and fmt be an SWML_FMT_*");
	call.op = op;
	call.fmt = fmt;
	call.tag = (uint32_t)tag;
	call.shard = 0;
	if (shard_obj) { /* checked: the "K" format would wrap a negative */
		call.shard = PyLong_AsUnsignedLongLong(shard_obj);
		if (PyErr_Occurred()) {
			PyErr_Clear();
			return PyErr_Format(PyExc_ValueError,
					    "allreduce: shard must be an int in [0, 2^64)");
		}
	}
	if (check_usable(self))
		return NULL;
	if (PyObject_GetBuffer(arg, &b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0)
		return NULL;
	kind = buf_kind(&b);
	if (b.itemsize != 4 || (kind != 'f' && kind != 'i')) {
		PyErr_Format(PyExc_TypeError,
			     "allreduce takes a writable C-contiguous float32 or "
			     "int32 buffer, not format '%s'",
			     b.format ? b.format : "B");
		PyBuffer_Release(&b);
		return NULL;
	}
	if (fmt != SWML_FMT_INT32 && (kind != 'f' || op != SWML_OP_SUM)) {
		PyErr_SetString(PyExc_ValueError, "allreduce: fmts SWML_FMT_INT16 and "
						  "SWML_FMT_OFFSET32 are for a float32 SUM only");
		PyBuffer_Release(&b);
		return NULL;
	}
	self->busy = 1;
	Py_BEGIN_ALLOW_THREADS
	status = swml_stream_run(&self->stream, b.buf, (size_t)(b.len / 4),
				 kind == 'f' ? SWML_FLOAT32 : SWML_INT32, &call);
	Py_END_ALLOW_THREADS
	self->busy = 0;
	PyBuffer_Release(&b);
	if (status == SWML_ENOMEM)
		return PyErr_NoMemory();
	return PyLong_FromLong(status);
}

static PyObject *Engine_pending_slots(EngineObject *self, PyObject *unused)
{
	PyObject *l = PyList_New(self->stream.n_pending);

	for (uint32_t i = 0; l && i < self->stream.n_pending; i++)
		PyList_SET_ITEM(l, i, PyLong_FromUnsignedLong(self->stream.pending[i]));
	return l;
}

static int put_u64(PyObject *d, const char *key, uint64_t v)
{
	PyObject *o = PyLong_FromUnsignedLongLong(v);
	int r = o ? PyDict_SetItemString(d, key, o) : -1;

	Py_XDECREF(o);
	return r;
}

static PyObject *Engine_stats(EngineObject *self, PyObject *unused)
{
	const struct swml_stream_stats *s = &self->stream.stats;
	struct xdp_statistics xs = {0};
	PyObject *d = PyDict_New();

	if (!d)
		return NULL;
	if (self->open && self->port.kind == SWML_PORT_XSK)
		swml_xsk_statistics(&self->port.xsk, &xs);
	if (put_u64(d, "packets_sent", s->packets_sent) ||
	    put_u64(d, "retransmissions", s->retransmissions) ||
	    put_u64(d, "spurious_timeouts", s->spurious_timeouts) ||
	    put_u64(d, "rack_resends", s->rack_resends) ||
	    put_u64(d, "tail_probes", s->tail_probes) ||
	    put_u64(d, "timeout_copies", s->timeout_copies) || put_u64(d, "results", s->results) ||
	    put_u64(d, "reorder_seen", s->reorder_seen) ||
	    put_u64(d, "reo_mult", self->stream.reo_mult) ||
	    put_u64(d, "duplicates", s->duplicates) ||
	    put_u64(d, "shadow_replies", s->shadow_replies) || put_u64(d, "ignored", s->ignored) ||
	    put_u64(d, "header_only", s->header_only) || put_u64(d, "forged", s->forged) ||
	    put_u64(d, "tx_deferred", s->tx_deferred) || put_u64(d, "sleeps", s->sleeps) ||
	    put_u64(d, "coalesced", s->coalesced) ||
	    put_u64(d, "srtt_us", self->stream.srtt_ns / 1000) ||
	    put_u64(d, "rto_us", self->stream.rto_ns / 1000) ||
	    put_u64(d, "window_waits", s->window_waits) ||
	    put_u64(d, "pace_waits", s->pace_waits) || put_u64(d, "rate_waits", s->rate_waits) ||
	    put_u64(d, "rate_kbps", self->stream.rate_kbps) ||
	    put_u64(d, "dscp", self->stream.dscp) ||
	    put_u64(d, "cwnd", (uint64_t)self->stream.win.cwnd) ||
	    put_u64(d, "tx_kicks", swml_port_kicks(&self->port)) ||
	    put_u64(d, "tx_kick_errors", swml_port_kick_errors(&self->port)))
		goto fail;
	if (self->port.tx_kind == SWML_PORT_UDP &&
	    (put_u64(d, "udp_gso_sends", self->port.udp.gso_sends) ||
	     put_u64(d, "udp_gso", (uint64_t)self->port.udp.gso)))
		goto fail;
	if (self->port.kind == SWML_PORT_UDP) { /* datagrams longer than any frame */
		if (put_u64(d, "udp_rx_truncated", self->port.udp.rx_truncated))
			goto fail;
	} else if (put_u64(d, "udp_tx", (uint64_t)(self->port.tx_kind == SWML_PORT_UDP)) ||
		   put_u64(d, "stray_results", self->port.strays) ||
		   put_u64(d, "zero_copy", (uint64_t)self->port.xsk.zero_copy) ||
		   put_u64(d, "xsk_rx_dropped", xs.rx_dropped) ||
		   put_u64(d, "xsk_rx_ring_full", xs.rx_ring_full) ||
		   put_u64(d, "xsk_rx_fill_ring_empty", xs.rx_fill_ring_empty_descs) ||
		   put_u64(d, "xsk_tx_invalid", xs.tx_invalid_descs) ||
		   put_u64(d, "xsk_tx_ring_empty", xs.tx_ring_empty_descs)) {
		goto fail;
	}
	return d;
fail:
	Py_DECREF(d);
	return NULL;
}

static PyObject *Engine_close(EngineObject *self, PyObject *unused)
{
	if (self->busy) {
		PyErr_SetString(PyExc_RuntimeError, "cannot close the engine during an allreduce");
		return NULL;
	}
	engine_close(self);
	Py_RETURN_NONE;
}

/* Set the abort flag first: the call that wakes reads it (stream.h, wake_fd).
 * Holds the GIL, as close() does, so the fd cannot close under it. */
static PyObject *Engine_wake(EngineObject *self, PyObject *unused)
{
	const uint64_t one = 1;

	if (self->open && write(self->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
		return PyErr_SetFromErrno(PyExc_OSError);
	Py_RETURN_NONE;
}

/* rebind(queue): between calls, the AF_XDP socket moves to rx queue
 * `queue` (port.h, swml_port_rebind); OSError where it cannot (the old one
 * kept). */
static PyObject *Engine_rebind(EngineObject *self, PyObject *args)
{
	unsigned int queue;
	char err[256];
	int ret;

	if (!PyArg_ParseTuple(args, "I", &queue))
		return NULL;
	if (!self->open || self->busy) {
		PyErr_SetString(PyExc_RuntimeError,
				"the socket moves between calls of an open engine only");
		return NULL;
	}
	Py_BEGIN_ALLOW_THREADS
	ret = swml_port_rebind(&self->port, self->ifname, queue, self->xskmap_fd, err, sizeof err);
	Py_END_ALLOW_THREADS
	if (ret) {
		errno = -ret;
		if (!self->port.xsk.xsk) { /* no socket at all: nothing left to stream over */
			engine_close(self);
			PyErr_Format(PyExc_OSError, "%s: the engine is closed", err);
		} else {
			PyErr_Format(PyExc_OSError, "%s", err);
		}
		return NULL;
	}
	Py_RETURN_NONE;
}

static PyObject *Engine_get_next_index(EngineObject *self, void *closure)
{
	return PyLong_FromUnsignedLongLong(self->stream.next_index);
}

/* Between calls only: where the stream goes on (a test's "calls before"). */
static int Engine_set_next_index(EngineObject *self, PyObject *value, void *closure)
{
	unsigned long long v;

	if (!value) {
		PyErr_SetString(PyExc_TypeError, "next_index cannot be deleted");
		return -1;
	}
	v = PyLong_AsUnsignedLongLong(value);
	if (PyErr_Occurred())
		return -1;
	if (self->busy) {
		PyErr_SetString(PyExc_RuntimeError, "next_index moves between calls only");
		return -1;
	}
	self->stream.next_index = v;
	return 0;
}

/* stats()["stray_results"] alone: read after every call, where a whole
 * stats() dict would cost more than the reading needs. */
static PyObject *Engine_get_stray_results(EngineObject *self, void *closure)
{
	return PyLong_FromUnsignedLongLong(self->open ? self->port.strays : 0);
}

static PyObject *Engine_get_fd(EngineObject *self, void *closure)
{
	return PyLong_FromLong(self->open ? swml_port_fd(&self->port) : -1);
}

static PyMethodDef Engine_methods[] = {
	{"allreduce", (PyCFunction)(void (*)(void))Engine_allreduce, METH_VARARGS | METH_KEYWORDS,
	 "allreduce(array, op, tag, fmt, shard=0) -> status: reduce a writable C-contiguous "
	 "float32/int32 buffer in place over the job with op (SWML_OP_*), as the call tagged "
	 "tag, payloads in fmt (SWML_FMT_*; INT16, OFFSET32 for a float32 SUM only); shard > 0: "
	 "elements per rank's shard, only this rank's is sure to hold the result (GIL released "
	 "for the whole tensor)."},
	{"pending_slots", (PyCFunction)Engine_pending_slots, METH_NOARGS,
	 "Slots that were still waiting for a result when the last allreduce failed."},
	{"stats", (PyCFunction)Engine_stats, METH_NOARGS, "Counters as a dict."},
	{"close", (PyCFunction)Engine_close, METH_NOARGS, "Close the socket and free the UMEM."},
	{"rebind", (PyCFunction)Engine_rebind, METH_VARARGS,
	 "rebind(queue): between calls, move the AF_XDP socket to that rx queue."},
	{"wake", (PyCFunction)Engine_wake, METH_NOARGS,
	 "End a running allreduce's sleep now, so that it reads the abort flag (set it first)."},
	{NULL}};

static PyGetSetDef Engine_getset[] = {
	{"next_index", (getter)Engine_get_next_index, (setter)Engine_set_next_index,
	 "packets of the job's life so far (settable between calls)"},
	{"fd", (getter)Engine_get_fd, NULL, "the AF_XDP or UDP socket's fd (-1 when closed)"},
	{"stray_results", (getter)Engine_get_stray_results, NULL,
	 "RESULTs read from the port's UDP socket under the AF_XDP one (port.h)"},
	{NULL}};

static PyTypeObject EngineType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "switchml_xdp._engine.Engine",
	.tp_basicsize = sizeof(EngineObject),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "An AF_XDP socket + UMEM on one interface queue, streaming tensors of one job.",
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)Engine_init,
	.tp_dealloc = (destructor)Engine_dealloc,
	.tp_methods = Engine_methods,
	.tp_getset = Engine_getset,
};

/* raw_pingpong(...): the path's ceiling (raw_path.h), on a socket of its own
 * opened and closed here; the GIL is released while it runs. */
static PyObject *py_raw_pingpong(PyObject *self, PyObject *args)
{
	const char *ifname;
	int xskmap_fd;
	PyObject *abort_obj, *src_mac, *dst_mac, *src_ip, *dst_ip, *d;
	unsigned int src_port, dst_port;
	double warmup, seconds;
	struct swml_raw_cfg cfg = {0};
	struct swml_raw_result r;
	struct swml_port_cfg port_cfg = {0};
	struct swml_port port;
	Py_buffer abort_buf;
	int udp_fd = -1;
	char err[256];
	int ret;

	if (!PyArg_ParseTuple(args, "siOSSSSIIIIIIdd|i", &ifname, &xskmap_fd, &abort_obj, &src_mac,
			      &dst_mac, &src_ip, &dst_ip, &src_port, &dst_port, &cfg.k, &cfg.window,
			      &cfg.batch, &cfg.spin, &warmup, &seconds, &udp_fd))
		return NULL;
	if (src_port > 65535 || dst_port > 65535 || !(warmup >= 0) || !(seconds > 0) ||
	    warmup + seconds > 3600) {
		PyErr_SetString(PyExc_ValueError, "raw_pingpong: parameter out of range");
		return NULL;
	}
	if (!cfg.batch)
		cfg.batch = SWML_RAW_BATCH;
	cfg.addrs.src_port = (uint16_t)src_port;
	cfg.addrs.dst_port = (uint16_t)dst_port;
	cfg.warmup_ns = (uint64_t)(warmup * 1e9);
	cfg.duration_ns = (uint64_t)(seconds * 1e9);
	if (bytes_arg(src_mac, cfg.addrs.src_mac, 6, "src_mac") ||
	    bytes_arg(dst_mac, cfg.addrs.dst_mac, 6, "dst_mac") ||
	    bytes_arg(src_ip, cfg.addrs.src_ip, 4, "src_ip") ||
	    bytes_arg(dst_ip, cfg.addrs.dst_ip, 4, "dst_ip"))
		return NULL;
	if (PyObject_GetBuffer(abort_obj, &abort_buf, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
		return NULL;
	if (abort_buf.len < 4 || ((uintptr_t)abort_buf.buf & 3)) {
		PyBuffer_Release(&abort_buf);
		PyErr_SetString(PyExc_ValueError,
				"abort must be a writable, 4-byte aligned buffer");
		return NULL;
	}
	cfg.abort = (const volatile uint32_t *)abort_buf.buf;
	Py_BEGIN_ALLOW_THREADS
	port_cfg = (struct swml_port_cfg){.ifname = ifname,
					  .frames = 4096,
					  .xskmap_fd = xskmap_fd,
					  .udp_fd = udp_fd,
					  .udp_gso = 1,
					  .udp_tx = 1,
					  .dst_port = cfg.addrs.dst_port};
	memcpy(port_cfg.dst_ip, cfg.addrs.dst_ip, 4);
	ret = swml_port_open(&port, &port_cfg, err, sizeof err);
	if (!ret) {
		ret = swml_raw_run(&port, &cfg, &r);
		if (ret == -EINVAL)
			snprintf(err, sizeof err,
				 "a frame of k=%u or a window of %u does not fit the "
				 "socket",
				 cfg.k, cfg.window);
		else if (ret)
			snprintf(err, sizeof err, "transmit failed: %s", strerror(-ret));
		swml_port_close(&port);
	}
	Py_END_ALLOW_THREADS
	PyBuffer_Release(&abort_buf);
	if (ret) {
		errno = -ret;
		PyErr_Format(ret == -EINVAL ? PyExc_ValueError : PyExc_OSError, "%s", err);
		return NULL;
	}
	d = PyDict_New();
	if (!d || put_u64(d, "sent", r.sent) || put_u64(d, "echoed", r.echoed) ||
	    put_u64(d, "bad", r.bad) || put_u64(d, "lost", r.lost) || put_u64(d, "late", r.late) ||
	    put_u64(d, "elapsed_ns", r.elapsed_ns) || put_u64(d, "kicks", r.kicks) ||
	    put_u64(d, "sleeps", r.sleeps) || put_u64(d, "frame_len", r.frame_len) ||
	    put_u64(d, "udp_tx", (uint64_t)(port.tx_kind == SWML_PORT_UDP))) {
		Py_XDECREF(d);
		return NULL;
	}
	return d;
}

static PyMethodDef module_methods[] = {
	{"exponent_bits", py_exponent_bits, METH_VARARGS, "exponent_bits(world) -> L"},
	{"quantize16", py_quantize16, METH_VARARGS,
	 "quantize16(x: float32, k, exp_global: int8[nb], out: int16[nb*k]) (quant16.py)"},
	{"dequantize16", py_dequantize16, METH_VARARGS,
	 "dequantize16(results: int16[nb*k], exp_global: int8[nb], nonfinite_any: bool[nb], "
	 "world, out: float32[n])"},
	{"ordered", py_ordered, METH_VARARGS,
	 "ordered(x: float32, op, out: int32): the float32 MIN/MAX map (switchml_xdp/ordered.py)"},
	{"unordered", py_unordered, METH_VARARGS, "unordered(q: int32, out: float32): its inverse"},
	{"raw_pingpong", py_raw_pingpong, METH_VARARGS,
	 "raw_pingpong(ifname, xskmap_fd, abort, src_mac, dst_mac, src_ip, dst_ip, src_port, "
	 "dst_port, k, window, batch (0: the engine's), spin, warmup_s, seconds[, udp_fd]) -> {sent, "
	 "echoed, bad, lost, late, elapsed_ns, kicks, sleeps, frame_len, udp_tx}: the path's ceiling "
	 "(raw_path.h; udp_fd: the sends in copy mode, as the engine's)"},
	{"engine_micro", py_engine_micro, METH_VARARGS,
	 "engine_micro(x, y, k, world, fmt, auth, passes, one_pass) -> {packets, loop_ns, <stage>: "
	 "ns}: the engine's per-packet work with no network (engine_micro.h)"},
	{"quant_simd", py_quant_simd, METH_VARARGS,
	 "quant_simd(level=-1) -> the vector kernels quantization runs (0 none, 1 AVX2); a "
	 "level >= 0 picks it, or the best below it the CPU has"},
	{"result_tag", py_result_tag, METH_VARARGS,
	 "result_tag(result_key: 16 bytes, hdr: swml header [+ payload], auth, payload_len) -> the "
	 "RESULT authenticator (u64; the header's key field holds it little-endian)"},
	{"packets", py_packets, METH_VARARGS,
	 "packets(n, k, slots, is_float, op) -> packets one call of n elements sends"},
	{"shard_owner", py_shard_owner, METH_VARARGS,
	 "shard_owner(p, n, k, lag, shard, world) -> the owner byte of packet p (plans.shard_owners)"},
	{"window_trace", py_window_trace, METH_VARARGS,
	 "window_trace(slots, window, events) -> [(cwnd, srtt, next_send, limit, gap, "
	 "rate_bound)]"},
	{"pace_encode", py_pace_encode, METH_VARARGS,
	 "pace_encode(value) -> the 16-bit pace code (wire.pace_encode)"},
	{"pace_decode", py_pace_decode, METH_VARARGS,
	 "pace_decode(code) -> the value it stands for (wire.pace_decode)"},
	{"block_exponents", py_block_exponents, METH_VARARGS,
	 "block_exponents(x: float32, k, exp_out: int8[nb], nonfinite_out: bool[nb])"},
	{"quantize", py_quantize, METH_VARARGS,
	 "quantize(x: float32, k, exp_global: int8[nb], world, out: int32[nb*k])"},
	{"dequantize", py_dequantize, METH_VARARGS,
	 "dequantize(sums: int32[nb*k], exp_global: int8[nb], nonfinite_any: bool[nb], world, "
	 "out: float32[n])"},
	{NULL}};

static struct PyModuleDef engine_module = {
	PyModuleDef_HEAD_INIT,
	"switchml_xdp._engine",
	"The AF_XDP worker engine of switchml-xdp (C): rings, streaming, quantization.",
	-1,
	module_methods,
};

PyMODINIT_FUNC PyInit__engine(void)
{
	PyObject *m;

	if (PyType_Ready(&EngineType) < 0)
		return NULL;
	m = PyModule_Create(&engine_module);
	if (!m)
		return NULL;
	Py_INCREF(&EngineType);
	if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0 ||
	    PyModule_AddIntConstant(m, "OK", SWML_OK) ||
	    PyModule_AddIntConstant(m, "ABORTED", SWML_ABORTED) ||
	    PyModule_AddIntConstant(m, "STALLED", SWML_STALLED) ||
	    PyModule_AddIntConstant(m, "EIO", SWML_EIO) ||
	    PyModule_AddIntConstant(m, "E2BIG", SWML_E2BIG) ||
	    PyModule_AddIntConstant(m, "DISAGREE", SWML_DISAGREE) ||
	    PyModule_AddIntConstant(m, "MAX_K", SWML_MAX_K)) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
