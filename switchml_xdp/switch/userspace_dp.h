/* SPDX-License-Identifier: MIT */
/*
 * userspace_dp.h - the user-space data plane's job and member tables, shared
 * by userspace_dp.c and switchml_xdp/switch/userspace.py (whose numpy dtypes
 * come from the generated layout). The includer provides <linux/types.h>.
 */
#ifndef SWML_USERSPACE_DP_H
#define SWML_USERSPACE_DP_H

struct us_job {
	__u32 active;
	__u32 world;
	__u32 slot_base;
	__u32 slot_count;
	__be32 group_ip;
	__be16 result_port;
	__u16 pad;
};

struct us_member {
	__be32 ip;
	__be16 port;
	__u16 pad;
};

#endif /* SWML_USERSPACE_DP_H */
