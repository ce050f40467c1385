/* swml_pass.c - an XDP program that lets every frame through.
 *
 * Why it exists: on veth, a frame that an XDP program sends with XDP_TX, or
 * redirects (XDP_REDIRECT, AF_XDP) into a veth, travels through the veth's
 * ndo_xdp_xmit into its peer's NAPI ring, and that ring only exists while the
 * peer has an XDP program attached. Without one the kernel drops the frame
 * (counted as a TX/xdp_xmit error, never visible to tcpdump). The lab therefore
 * attaches this program in native mode to the bridge-side veth ends, so the
 * switch's XDP_TX results (and the reflector's) reach the bridge: by default
 * every host's end, with Lab(port_hooks="boxes") the boxes' alone (an AF_XDP
 * socket in copy mode sends skbs, which need no program on the peer; see
 * switchml_xdp/lab/wiring.py, PORT_HOOKS, for what a hook costs a frame).
 * XDP_PASS keeps the normal stack (and the bridge) in charge.
 */
#include <uapi/linux/bpf.h>

int swml_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

/* Lab(multicast=False): on the switch's bridge-side end, in place of swml_pass,
 * drop what the switch sends to an IPv4 multicast group (destination MAC
 * 01:00:5e, the low half of its fourth byte's top bit clear: RFC 1112), as a
 * network without multicast (a cloud VPC) does; everything else passes. */
int swml_pass_no_multicast(struct xdp_md *ctx)
{
	unsigned char *dst = (void *)(long)ctx->data;

	if ((void *)(dst + 6) > (void *)(long)ctx->data_end)
		return XDP_PASS;
	if (dst[0] == 0x01 && dst[1] == 0x00 && dst[2] == 0x5e && !(dst[3] & 0x80))
		return XDP_DROP;
	return XDP_PASS;
}
