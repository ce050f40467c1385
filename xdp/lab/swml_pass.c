/* swml_pass.c - an XDP program that lets every frame through.
 *
 * Why it exists: on veth, a frame that an XDP program sends with XDP_TX, or
 * redirects (XDP_REDIRECT, AF_XDP) into a veth, travels through the veth's
 * ndo_xdp_xmit into its peer's NAPI ring, and that ring only exists while the
 * peer has an XDP program attached. Without one the kernel drops the frame
 * (counted as a TX/xdp_xmit error, never visible to tcpdump). The lab therefore
 * attaches this program in native mode to every bridge-side veth end, so the
 * switch's XDP_TX results and the workers' AF_XDP transmissions reach the
 * bridge. XDP_PASS keeps the normal stack (and the bridge) in charge.
 */
#include <uapi/linux/bpf.h>

int swml_pass(struct xdp_md *ctx)
{
    return XDP_PASS;
}
