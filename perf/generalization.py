"""How close the planner comes to the bound on machines it was never shaped on (simulated).

Families (``--families``, default all), each planned for allreduce, allgather and broadcast at
``--size`` (1 GiB) exactly as ``collectx plan`` plans them:

* ``presets``: every preset, whole machine;
* ``dgx1``: every allocation of 2..8 GPUs of dgx1v and dgx1p (247 each; ``--limit`` samples);
* ``subsets``: random allocations of the other presets (``--samples`` each);
* ``generated``: switches, rings, full meshes and multi-socket PCIe trees with and without
  NVLink bridge pairs, of random sizes and bandwidths;
* ``irregular``: PCIe trees with random GPU link meshes, or with NVSwitch planes that some
  GPUs reach over fewer links (``--samples`` machines, two allocations each);
* ``degraded``: presets and real dumps with one or two GPU links narrowed or gone
  (``--samples`` machines);
* ``meshes``: GPU meshes over PCIe trees that no generator above draws: tori, hypercubes,
  fully linked groups joined by single links, two NVSwitch domains bridged by a few links
  (``--samples`` rounds of each, three allocations each);
* ``real``: random allocations of the real dumps in ``topology/real`` the planner may be
  developed against;
* ``held-out``: 50 (``--held-out``) random allocations of each of :data:`HELD_OUT`, 143
  real dumps kept aside: never used while developing the planner, reported on their own;
* ``files``: as many random allocations of each topology file named by ``--files`` (any
  format ``collectx.topology.load`` reads): machines from outside this repository.

Prints one table: per family the plans, the worst and median efficiency (predicted busbw over
the bound), how many fall below 0.95, how many beat the bound (allreduce: the ceiling; a
violation means the simulator or the bound is wrong), the median and slowest planning time, and
how many plans took longer than :func:`time_target` (1 s up to 8 GPUs, 5 s up to 16).
``--jsonl FILE`` writes one line per plan. ``--no-host-relays`` plans as the CUDA engine does
(no tree edge staged through host memory, against bounds without host staging); by default
plans may stage through host memory, as the CPU executor's do.

Run: ``python perf/generalization.py`` (about an hour), or e.g.
``python perf/generalization.py --families presets,generated --samples 5``; on two cores,
``--shard 0/2 --jsonl a.jsonl`` and ``--shard 1/2 --jsonl b.jsonl`` side by side, then
``--merge a.jsonl b.jsonl`` for the table.
"""

from __future__ import annotations

import _checkout  # noqa: F401  (this checkout's collectx first)

import argparse
import contextlib
import itertools
import json
import random
import statistics
import sys
from pathlib import Path

import collectx.topology as T
from collectx.errors import NoFeasiblePlan
from collectx.planner import plan
from collectx.planner._build import forget_remembered
from collectx.topology.model import GPU_LINK_TYPES
from planner import add_host_relays_option

COLLECTIVES = ("allreduce", "allgather", "broadcast")
REAL = Path(__file__).resolve().parent.parent / "topology" / "real"
# Real dumps never used while developing the planner: their results are the test. The eight
# after the first four were added at once, after its methods were settled, and two sets of
# twelve, one of thirteen, one of twenty-one, one of twenty-seven and one of twenty-three at
# once each, long after (topology/real/SOURCES.md).
HELD_OUT = ("l40s_8gpu_2socket_nvidia-smi-topo.txt",
            "mi100_8gpu_6xgmi_2socket_rccl_topo.xml",
            "rtx_a6000_8gpu_nvlink_pairs_2nic_nvidia-smi-topo.txt",
            "a800_8gpu_4nic_nvidia-smi-topo.txt",
            "a100_pcie_4gpu_2socket_1nic_adroit_nvidia-smi-topo.txt",
            "v100_power9_4gpu_nv3_pairs_4nic_traverse_nvidia-smi-topo.txt",
            "a100_sxm4_4gpu_nv4_4numa_2nic_polaris_nvidia-smi-topo.txt",
            "b300_8gpu_nv18_9nic_nvidia-smi-topo.txt",
            "b200_8gpu_nv18_16nic_damaged_paste_nvidia-smi-topo.txt",
            "rtx4090_8gpu_pcie_2socket_2nic_nvidia-smi-topo.txt",
            "mi210_3gpu_pcie_2socket_1nic_rccl_topo.xml",
            "mi50_8gpu_2xgmi_rings_4numa_2nic_rccl_topo.xml",
            "gh200_quad_4gpu_nv6_4grace_nvidia-smi-topo.txt",
            "h200_8gpu_nv18_10nic_sprocket_nvidia-smi-topo.txt",
            "h100_nvl_8gpu_nv12_pairs_2nic_nvidia-smi-topo.txt",
            "dgx_a100_8gpu_12nic_mlx5_header_nvidia-smi-topo.txt",
            "a100_sxm4_8gpu_epyc7742_10nic_nic_legend_nvidia-smi-topo.txt",
            "dgx1_8gpu_4nic_pcie_only_nvidia-smi-topo-mp.txt",
            "v100_sxm2_8gpu_wechat_yard_reformatted_nvidia-smi-topo.txt",
            "v100_sxm2_2gpu_nv6_plus_rtx3090_homelab_nvidia-smi-topo.txt",
            "h100_4gpu_nv6_4nic_comma_cpulist_nvidia-smi-topo.txt",
            "nvlink_2gpu_subset_visible_8nic_mlx5_header_container_nvidia-smi-topo.txt",
            "pcie_8gpu_pix_pairs_2socket_1nic_2018_no_numa_column_nvidia-smi-topo.txt",
            "t600_1gpu_1roce_nic_numa1_only_nccl_topo.xml",
            "oci_gb300_2tray_8gpu_8nic_mnnvl_fused_nccl_topo.xml",
            "oci_bm_gpu_b300_8gpu_8nic_cx8_nccl_topo.xml",
            "b200_8gpu_13nic_gvisor_vm_flat_nccl_topo.xml",
            "oci_bm_gpu_h100_8gpu_16nic_nccl_topo.xml",
            "dgx_h200_8gpu_12nic_nvidia-smi-topo.txt",
            "h100_8gpu_12nic_numa_off_aihub0007_nvidia-smi-topo.txt",
            "h100_8gpu_12nic_numa_off_glued_cells_aihub0008_nvidia-smi-topo.txt",
            "princeton_pli_della_h100_8gpu_6nic_odd_affinity_nvidia-smi-topo.txt",
            "princeton_pli_h100_1of8gpu_visible_6nic_slurm_job_nvidia-smi-topo.txt",
            "l40s_4gpu_2nic_2socket_nics_on_numa1_nvidia-smi-topo.txt",
            "rtx3090_8gpu_switchtec_2socket_1nic_nccl_topo.xml",
            "rtx4090_4gpu_epyc_4numa_virtual_nics_nccl_topo.xml",
            "a100_sxm4_4gpu_nv4_4nic_all_numa0_rst_indented_nvidia-smi-topo.txt",
            "a100_sxm4_4gpu_nv4_4numa_reversed_polaris_loongserve_nvidia-smi-topo.txt",
            "a100_sxm4_4of8gpu_visible_3nic_bond_simai_nccl_topo.xml",
            "b300_8gpu_nv18_8nic_cx8_bond_deepep590_nvidia-smi-topo.txt",
            "consumer_5gpu_pcie_2numa_one_gpu_on_numa1_club3090_46_nvidia-smi-topo.txt",
            "h20_8gpu_nv18_36nic_vf_glued_cells_sglang14092_nvidia-smi-topo.txt",
            "h20_8gpu_nv18_8nic_tabbed_sglang24966_nvidia-smi-topo.txt",
            "h800_8gpu_nv8_4nic_column_clipped_paste_nvidia-smi-topo.txt",
            "h800_8gpu_nv8_9nic_bond_on_numa0_sglang28424_nvidia-smi-topo.txt",
            "oci_bm_gpu_h100_8gpu_16nic_container_view_nccl_topo.xml",
            "rtx2080ti_4gpu_all_pix_one_switch_lmdeploy4863_nvidia-smi-topo.txt",
            "rtx3090_2gpu_sys_numa_na_legend_cut_club3090_178_nvidia-smi-topo.txt",
            "v100_pcie_4gpu_pix_pairs_under_phb_lmdeploy4558_nvidia-smi-topo.txt",
            "a100_sxm_4gpu_nv4_4nic_affinity_0_numa_0-1_leonardo_nvidia-smi-topo.txt",
            "a30_4gpu_nv4_bridge_pairs_1nic_2socket_vllm29070_nvidia-smi-topo.txt",
            "v100_sxm2_8gpu_dgx1_hybrid_cube_2nic_slurm_preamble_nvidia-smi-topo.txt",
            "rtx3090_rtx4090_2gpu_glow_rendered_club3090_1125_nvidia-smi-topo.txt",
            "rtx5090_2gpu_phb_threadripper3975wx_tabbed_club3090_1140_nvidia-smi-topo.txt",
            "gh200_quad_4gpu_nv6_markdown_pipe_table_sigma2_hpccourse_nvidia-smi-topo.txt",
            "gtx1080ti_2gpu_phb_consumer_numa_na_prompt_xuesongtap_nvidia-smi-topo.txt",
            "a100_8gpu_nv12_17nic_all_numa0_bond_prompt_xuesongtap_nvidia-smi-topo.txt",
            "a10_4gpu_all_sys_single_numa_vm_2nic_xuesongtap_nvidia-smi-topo.txt",
            "nvidia_gb10_dgx_spark_1gpu_wifi_tailscale_c2c_nccl_topo.xml",
            "rtx_a6000_1of2gpu_nvlink_peer_absent_merged_nic_trimmed_nccl_topo.xml",
            "simai_a100_sxm4_1of8gpu_empty_bridge_2bond_nic_nccl_topo.xml",
            "oci_bm_gpu_a100_v2_8gpu_16nic_milan_numa1357_5level_pcie_nccl_topo.xml",
            "oci_bm_gpu4_a100_40gb_8gpu_16nic_rome_numa1357_nccl_topo.xml",
            "a100_pcie_2gpu_nvlink_bridge_icelake_dualport_nic_nccl_topo.xml",
            "a100_pcie_2gpu_asymmetric_nvlink_count_host_hash_last_nccl_topo.xml",
            "nersc_perlmutter_a100_sxm4_4gpu_nv4_4numa_slingshot_cxi_nccl_topo.xml",
            "vastai_hgx_b200_8gpu_container_hidden_nvswitch_eth0_per_cpu_nccl_topo.xml",
            "vastai_hgx_h200_8gpu_container_ti_bridges_eth0_per_cpu_nccl_topo.xml",
            "rtx6000ada_4gpu_2socket_genoa_4nic_cx7_asus_esc8000a_nvidia-smi-topo.txt",
            "gb200_4gpu_nv18_2grace_tray_no_nics_k8stestinfra371_nvidia-smi-topo.txt",
            "gcp_a3_h100_8gpu_hidden_nvswitch_5gvnic_plus_gke_cilium_nics_xla_nccl_topo.xml",
            "dgx_a100_8gpu_6nvswitch_numa3175_8nic_skip_mlx5_4_5_xla_nccl_topo.xml",
            "mi300x_8gpu_xgmi_mlx_bridge_pairs_veth_plus_100g_xla_rccl_topo.xml",
            "azure_nc48ads_a100_v4_2gpu_nvlink_bridge_2numa_eth0_nccl_topo.xml",
            "gb300_nvl72_2tray_8gpu_fused_redacted_host_hash_bond_nic_nccl_topo.xml",
            "mi250x_8gcd_xgmi_4numa_4nic_net_names_rccl_topo.xml",
            "mi250x_8gcd_single_xgmi_3numa_bond0_1gbe_gdr0_rccl_topo.xml",
            "mi100_8gpu_2hives_intel_1numa_1nic_rccl_topo.xml",
            "mi50_4gpu_xgmi_ring_skylake_1nic_rccl_topo.xml",
            "mi50_8gpu_xgmi_rings_7numa_rccl_topo.xml",
            "dgx1_p100_8gpu_nv1_cube_4nic_soc_glued_header_sharc_nvidia-smi-topo.txt",
            "k40m_4gpu_phb_pairs_2socket_mlx4_soc_legend_tensorflow_gdr_nvidia-smi-topo.txt",
            "gtx1070_1080_7gpu_pix_groups_1socket_soc_unindented_rossum_nvidia-smi-topo.txt",
            "gtx1070_1080_7gpu_phb_2socket_soc_ansi_header_rossum_nvidia-smi-topo.txt",
            "azure_nv24_m60_4gpu_all_soc_same_cpu_rossum_nvidia-smi-topo.txt",
            "azure_nv12_m60_2gpu_soc_same_cpu_no_legend_no_eol_rossum_nvidia-smi-topo.txt",
            "pcie_4gpu_phb_pairs_soc_javadoc_prefixed_hadoop_yarn_nvidia-smi-topo.txt",
            "mi50_8gpu_pcie_only_skylake_2switch_1ib_nic_rccl_topo.xml",
            "mi50_8gpu_2xgmi_rings_skylake_2nic_rccl_topo.xml",
            "nv18_8gpu_12nic_3port_pix_groups_mooncake2039_nvidia-smi-topo.txt",
            "rtx3090_8gpu_pcie_node_per_socket_no_nic_lmdeploy4917_nvidia-smi-topo.txt",
            "h20_3e_8gpu_nv18_11nic_pix3_group_bond_sglang28893_nvidia-smi-topo.txt",
            "h20_3e_8gpu_nv18_2nic_pix_gpu0_sglang23020_nvidia-smi-topo.txt",
            "rtx5090_8gpu_pcie_2socket_2nic_512cpu_sglang23020_nvidia-smi-topo.txt",
            "nv18_2of8gpu_visible_10nic_container_stdout_zhou_nvidia-smi-topo.txt",
            "pcie_2gpu_sys_2socket_2nic_single_space_wuyea_nvidia-smi-topo.txt",
            "b200_8gpu_nv18_4nic_pipe_table_no_nic_rows_dsvolk_nvidia-smi-topo.txt",
            "a100_pcie_1gpu_header_on_label_line_scalellm288_nvidia-smi-topo.txt",
            "pcie_4gpu_pxb_pair_pix_pair_2socket_nccl667_nvidia-smi-topo.txt",
            "h100_8gpu_nv18_pairs_one_nv17_sglang3780_nvidia-smi-topo.txt",
            "a800_pcie_8gpu_nv8_nv6_nv4_odd_bridges_vllm9469_nvidia-smi-topo.txt",
            "h100_4gpu_nv6_asymmetric_gpu2_row_vllm8947_nvidia-smi-topo.txt",
            "rtx4080_10gpu_pix_groups_2socket_sglang7903_nvidia-smi-topo.txt",
            "a100_sxm4_8gpu_nv12_9nic_phb_groups_sglang1872_nvidia-smi-topo.txt",
            "h100_8gpu_nv18_kvm_log_prefixed_sglang5096_nvidia-smi-topo.txt",
            "a100_sxm4_8gpu_no_nvlink_9nic_glued_cells_sglang5013_nvidia-smi-topo.txt",
            "h100_8gpu_nv18_10nic_glued_affinity_sglang3658_nvidia-smi-topo.txt",
            "b200_8gpu_nv18_4numa_12nic_glued_heading_vllm20862_nvidia-smi-topo.txt",
            "h100_1gpu_63of140nic_shown_vllm8904_nvidia-smi-topo.txt",
            "h100_5of8gpu_visible_nv18_12nic_sglang3112_nvidia-smi-topo.txt",
            "rtx3090_4gpu_one_nv4_bridge_pair_vllm12354_nvidia-smi-topo.txt",
            "v100_sxm2_8gpu_hybrid_cube_all_numa1_vllm20303_nvidia-smi-topo.txt",
            "grid_a100_40c_vgpu_3gpu_pix_vm_vllm20484_nvidia-smi-topo.txt",
            "rtx3090x4_rtx5090x2_6gpu_mixed_sglang7482_nvidia-smi-topo.txt",
            "aws_p4d_24xl_a100_8gpu_nv12_no_nics_gnosia93_nvidia-smi-topo.txt",
            "aws_g6e_12xl_l40s_4gpu_all_node_gnosia93_nvidia-smi-topo.txt",
            "aws_p5_48xl_h100_8gpu_nv18_no_nics_gnosia93_nvidia-smi-topo.txt",
            "ncsa_delta_a100x4_nv4_numa_reversed_hash_quoted_nvidia-smi-topo.txt",
            "dkrz_levante_a100_4gpu_2nic_topo_mp_hash_quoted_nvidia-smi-topo.txt",
            "princeton_della_i14g20_2gpu_sys_2nic_jdh4_nvidia-smi-topo.txt",
            # a ninth set (topology/real/SOURCES.md), planned first as held out
            "a100_sxm4_40gb_2gpu_direct_nvlink12_sapphire_rapids_bnxt_re_2500mbps_nic_on_numa1_nccl_topo.xml",
            "h800_8gpu_nv8_sapphire_rapids_8nic_cx7_coll_maxconn1_nccl_topo.xml",
            "l20_16gpu_pcie_cascaded_pex_switches_8nic_bf3_nccl_topo.xml",
            "rtp_llm_8gpu_gen6_cx8_switch_granite_rapids_8bond_plus_4port_nic_trimmed_nccl_topo.xml",
            "rtx4090_2gpu_epyc_rome_numa2_3_cx4_dualport_nccl_topo.xml",
            "rtx_a4500_3gpu_dell_workstation_skylake_2socket_intel_1g_nics_docker_bridges_nccl_topo.xml",
            "rtx_a6000_1gpu_xilinx_ernic_xtrdma_25g_gdr1_plx_switch_nccl_topo.xml",
            "rtx_a6000_2gpu_nvlink_bridge_epyc_rome_numa_minus1_eno1_nccl_topo.xml",
            "rtx_a6000_4gpu_pcie_skylake_2socket_broadcom_1g_docker_veth_nics_nccl_topo.xml",
            "v100_4gpu_pcie_plx8747_broadwell_2socket_2nic_cx6dx_25g_gdr0_nccl_topo.xml",
            "v100_sxm2_16gb_8gpu_hybrid_cube_mesh_cloud_vm_flat_pcie_numa_minus1_eno1_nccl_topo.xml",
            "v100_sxm2_32gb_8gpu_dgx1_hybrid_cube_mesh_broadwell_1g_nic_lxcbr_docker_bridges_nccl_topo.xml",
            "dgx1_v100_8gpu_nv1_nv2_cube_4nic_unsorted_mlx5_columns_msccl_nvidia-smi-topo.txt",
            "dgx1_v100_8gpu_4nic_mlx5_2031_columns_sys_with_one_affinity_pytorch_ddp_bench_nvidia-smi-topo.txt",
            "aliyun_sccgn6_v100_8gpu_nv1_nv2_sys_one_affinity_vm_prompt_gpushare_nvidia-smi-topo.txt",
            "v100_sxm2_8gpu_baidu_cube_variant_one_numa_unindented_header_paddlefleetx_nvidia-smi-topo.txt",
            "v100_sxm2_2gpu_sys_4nic_pix_pairs_two_hosts_timestamped_run_cmd_log_ssbandjl_nvidia-smi-topo.txt",
            "gh200_480gb_1gpu_gpu_numa_id_1_4nic_bluefield3_aerial_cubb_report_prefix_nvidia-smi-topo.txt",
            "rtx3090x6_rtx5060ti_7gpu_nv4_bridge_pair_pxb_group_of5_markdown_table_llamacpp_multigpu_nvidia-smi-topo.txt",
            "rtx4090_8gpu_phb_pairs_6plus2_numa_split_vastai_container_llamacpp_multigpu_nvidia-smi-topo.txt",
            "v100_sxm2_8gpu_hybrid_cube_1nic_named_mlx5_2_vastai_container_llamacpp_multigpu_nvidia-smi-topo.txt",
            "rtx_pro_6000_blackwell_8gpu_all_sys_8_of_16_numa_nodes_abridged_legend_kubesimplify_nvidia-smi-topo.txt",
            "gb200_4gpu_nv18_8nic_all_sys_numa_affinity_lists_0_2-17_openshift_rhel4nv_nvidia-smi-topo.txt")
DGX1 = ("dgx1v", "dgx1p")
FAMILIES = ("presets", "dgx1", "subsets", "generated", "irregular", "degraded", "meshes",
            "real", "held-out", "files")


def presets(args, rng):
    for name in T.presets():
        yield "presets", name, T.load(name), None


def dgx1(args, rng):
    for name in DGX1:
        G = T.load(name)
        for k in range(2, 9):
            combos = list(itertools.combinations(range(8), k))
            if args.limit and len(combos) > args.limit:
                combos = rng.sample(combos, args.limit)
            for gpus in combos:
                yield "dgx1", name, G, list(gpus)


def subsets(args, rng):
    for name in T.presets():
        if name not in DGX1:
            G = T.load(name)
            yield from _random_allocations("subsets", name, G, args.samples, rng)


def generated(args, rng):
    for i in range(args.samples):
        n = rng.randint(2, 16)
        bw = rng.choice((25.0, 50.0, 64.0))
        yield "generated", f"switch({n})", T.switch(n, bw), None
        yield "generated", f"ring({n})", T.ring(n, bw), None
        m = rng.randint(2, 8)
        yield "generated", f"fully_connected({m})", T.fully_connected(m, bw), None
        shape = (rng.randint(1, 2), rng.randint(1, 2), rng.choice((1, 2, 4)))
        kw = dict(pcie_bw=rng.choice((15.75, 31.5, 63.0)), smp_bw=rng.choice((20.0, 40.0)))
        bridged = rng.random() < 0.5 and shape[1] * shape[2] * shape[0] % 2 == 0
        if bridged:
            kw.update(pair_bw=rng.choice((25.0, 50.0, 100.0)), pairs_across=rng.random() < 0.5)
        G = T.pcie_tree(*shape, **kw)
        yield "generated", f"pcie_tree{shape}{' bridged' if bridged else ''}", G, None


def irregular(args, rng):
    """Shapes the generated family lacks: PCIe trees with GPU links drawn at random (each
    pair linked with probability ``p``, one to four links), or with NVSwitch planes that some
    GPUs reach over fewer links than others, or not at all."""
    for _ in range(args.samples):
        shape = rng.choice(((1, 2, 2), (2, 1, 2), (2, 2, 2), (1, 1, 4), (1, 2, 3), (1, 4, 2)))
        pcie, smp = rng.choice((15.75, 31.5, 63.0)), rng.choice((20.0, 40.0, 64.0))
        G = T.pcie_tree(*shape, pcie_bw=pcie, smp_bw=smp)
        n, unit = len(T.gpus(G)), rng.choice((25.0, 50.0))
        if rng.random() < 0.5:
            kind, p = rng.choice(GPU_LINK_TYPES), rng.choice((0.3, 0.5, 0.8))
            for a, b in itertools.combinations(range(n), 2):
                if rng.random() < p:
                    T.add_link(G, f"GPU{a}", f"GPU{b}", kind, unit * rng.randint(1, 4))
            name = f"pcie_tree{shape} {kind} mesh p={p}"
        else:
            planes = rng.randint(1, 6)
            for k in range(planes):
                T.add_node(G, f"NVS{k}", "nvswitch")
                for g in range(n):   # most GPUs reach every plane over two links
                    links = rng.choice((0, 1, 2)) if rng.random() < 0.3 else 2
                    if links:
                        T.add_link(G, f"GPU{g}", f"NVS{k}", "nvlink", unit * links)
            name = f"pcie_tree{shape} {planes} uneven planes"
        yield from _random_allocations("irregular", f"{name} pcie={pcie}", G, 2, rng)


def degraded(args, rng):
    """Presets and real dumps with one or two GPU links narrowed (to a half or three
    quarters) or gone, as a board with a failed NVLink or xGMI lane reports."""
    sources = list(T.presets()) + [path for path in sorted(REAL.iterdir())
                                   if path.suffix in (".xml", ".txt")
                                   and path.name not in HELD_OUT]
    for _ in range(args.samples):
        source = rng.choice(sources)
        G = T.load(source)
        gpus = set(T.gpus(G))
        links = sorted((u, v) for u, v, kind in G.edges(data="type")
                       if kind in GPU_LINK_TYPES and u in gpus and (v not in gpus or u < v))
        changes = []
        for u, v in rng.sample(links, min(len(links), rng.choice((1, 1, 2)))):
            factor = rng.choice((0.0, 0.5, 0.75))
            for a, b in ((u, v), (v, u)):
                if not factor:
                    G.remove_edge(a, b)
                else:
                    G.edges[a, b]["bw_gbps"] *= factor
            changes.append(f"{u}-{v} x{factor}")
        name = f"{getattr(source, 'name', source)} {', '.join(changes)}"
        yield from _random_allocations("degraded", name, G, 1 + (rng.random() < 0.6), rng)


def meshes(args, rng):
    """Structured GPU meshes on a PCIe tree (for host staging): a torus, a hypercube (some of
    its links doubled), fully linked groups with one link from each group to the next, and two
    NVSwitch domains joined by direct links between some of their GPUs."""
    def tree(n):
        shape = {6: (1, 2, 3), 8: (2, 2, 2), 12: (2, 2, 3), 16: (2, 2, 4)}[n]
        return T.pcie_tree(*shape, pcie_bw=rng.choice((15.75, 31.5, 63.0)),
                           smp_bw=rng.choice((20.0, 40.0)))

    def link(G, a, b, kind, bw):
        if not G.has_edge(f"GPU{a}", f"GPU{b}"):
            T.add_link(G, f"GPU{a}", f"GPU{b}", kind, bw)

    def torus(a, b, bw):
        G = tree(a * b)
        for i, j in itertools.product(range(a), range(b)):
            for k in (i * b + (j + 1) % b, (i + 1) % a * b + j):
                if k != i * b + j:
                    link(G, i * b + j, k, "nvlink", bw)
        return f"torus {a}x{b} bw={bw}", G

    def cube(d, bw):
        G = tree(1 << d)
        for u, k in itertools.product(range(1 << d), range(d)):
            if u < u ^ (1 << k):
                link(G, u, u ^ (1 << k), "nvlink", bw * rng.choice((1, 1, 2)))
        return f"hypercube {d} bw={bw}", G

    def groups(g, size, bw, kind):
        G = tree(g * size)
        for k in range(g):
            for a, b in itertools.combinations(range(k * size, (k + 1) * size), 2):
                link(G, a, b, kind, 2 * bw)
            link(G, k * size + rng.randrange(size), (k + 1) % g * size + rng.randrange(size),
                 kind, bw)
        return f"{g} groups of {size}, {kind} bw={bw}", G

    def domains(size, bw):
        G = tree(2 * size)
        for k in range(2):
            T.add_node(G, f"NVS{k}", "nvswitch")
            for i in range(size):
                T.add_link(G, f"GPU{k * size + i}", f"NVS{k}", "nvlink", 2 * bw)
        for i in rng.sample(range(size), rng.randint(1, size)):
            link(G, i, size + i, "nvlink", bw)
        return f"two switch domains of {size}, bridged, bw={bw}", G

    for _ in range(args.samples):
        bw, kind = rng.choice((25.0, 50.0, 100.0)), rng.choice(("nvlink", "xgmi"))
        for name, G in (torus(*rng.choice(((2, 3), (2, 4), (3, 4), (4, 4))), bw),
                        cube(rng.choice((3, 4)), bw),
                        groups(*rng.choice(((2, 4), (4, 2), (3, 4), (4, 4))), bw, kind),
                        domains(rng.choice((4, 8)), bw)):
            yield from _random_allocations("meshes", name, G, 3, rng)


def real(args, rng):
    paths = [path for path in sorted(REAL.iterdir())
             if path.suffix in (".xml", ".txt") and path.name not in HELD_OUT]
    yield from _of_files("real", paths, args.samples, rng)


def held_out(args, rng):
    yield from _of_files("held-out", [REAL / name for name in HELD_OUT], args.held_out, rng)


def files(args, rng):
    yield from _of_files("files", [Path(path) for path in args.files], args.held_out, rng)


def _of_files(family, paths, count, rng):
    """:func:`_random_allocations` of each topology file of ``paths``, named by file name."""
    for path in paths:
        yield from _random_allocations(family, path.name, T.load(path), count, rng)


def _random_allocations(family, name, G, count, rng):
    """``count`` random allocations of 2 GPUs or more (the whole machine among them); the
    whole machine alone where it has fewer than 3 GPUs (it is then the only allocation)."""
    n = len(T.gpus(G))
    yield family, name, G, None
    for _ in range(count - 1 if n > 2 else 0):
        k = rng.randint(2, n)
        yield family, name, G, sorted(rng.sample(range(n), k))


SOURCES = {"presets": presets, "dgx1": dgx1, "subsets": subsets, "generated": generated,
           "irregular": irregular, "degraded": degraded, "meshes": meshes, "real": real,
           "held-out": held_out, "files": files}


def record(family, name, G, gpus, collective, nbytes, host_relays=True) -> dict:
    forget_remembered()   # timed as a first plan of its allocation: nothing remembered
    p = plan(G, collective, nbytes, gpus=gpus, verify=False, host_relays=host_relays)
    d = p.summary()
    d.update(family=family, topology=name, gpus=gpus or "all")
    return d


def over(r: dict) -> bool:
    cap = r["ceiling_busbw_GBps"] if r["collective"] == "allreduce" else r["bound_busbw_GBps"]
    return bool(cap) and r["predicted_busbw_GBps"] > 1.001 * cap


def time_target(nranks: int) -> float:
    """Seconds a plan of ``nranks`` GPUs may take: 1 up to 8, 5 up to 16 (then 5 per 16)."""
    return 1.0 if nranks <= 8 else 5.0 * -(-nranks // 16)


def late(r: dict) -> bool:
    """Whether plan ``r`` took longer than :func:`time_target` allows."""
    return r["planning_time_s"] > time_target(len(r["ranks"]))


def table(rows: list[dict]) -> str:
    lines = [f"{'family':<10}{'collective':<11}{'plans':>6}{'worst':>8}{'median':>8}"
             f"{'<0.95':>7}{'over':>6}{'median s':>10}{'slowest s':>11}{'late':>6}  worst plan"]
    for family in FAMILIES:
        for coll in COLLECTIVES:
            sel = [r for r in rows if r["family"] == family and r["collective"] == coll
                   and r["efficiency"] is not None]
            if not sel:
                continue
            worst = min(sel, key=lambda r: r["efficiency"])
            eff, times = [r["efficiency"] for r in sel], [r["planning_time_s"] for r in sel]
            lines.append(f"{family:<10}{coll:<11}{len(sel):>6}{min(eff):>8.3f}"
                         f"{statistics.median(eff):>8.3f}{sum(e < 0.95 for e in eff):>7}"
                         f"{sum(map(over, sel)):>6}{statistics.median(times):>10.2f}"
                         f"{max(times):>11.2f}{sum(map(late, sel)):>6}  "
                         f"{worst['topology']} {worst['gpus']} ({worst['algorithm']})")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--size", type=int, default=1 << 30)
    ap.add_argument("--samples", type=int, default=10, help="allocations per machine")
    ap.add_argument("--limit", type=int, default=0, help="dgx1 allocations per size (0: all)")
    ap.add_argument("--held-out", type=int, default=50,
                    help="allocations per held-out dump and per --files file")
    ap.add_argument("--files", nargs="+", default=[], metavar="TOPOLOGY",
                    help="topology files for the files family (e.g. dumps from other sources)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jsonl", help="write one JSON line per plan")
    ap.add_argument("--collectives", default=",".join(COLLECTIVES),
                    help="comma-separated, of " + ", ".join(COLLECTIVES))
    add_host_relays_option(ap)
    ap.add_argument("--shard", default="0/1", help="I/N: plan only allocations I, I+N, I+2N, "
                    "... of each family (run N processes, then --merge their --jsonl files)")
    ap.add_argument("--merge", nargs="+", metavar="JSONL",
                    help="print the table of earlier --jsonl files instead of planning")
    args = ap.parse_args(argv)
    if args.merge:
        rows = []
        for name in args.merge:
            with open(name) as f:
                rows += [json.loads(line) for line in f if line.strip()]
        print(table(rows))
        return 0
    shard, shards = map(int, args.shard.split("/"))
    with open(args.jsonl, "w") if args.jsonl else contextlib.nullcontext() as out:
        rows = _planned(args, shard, shards, out)
    print(table(rows))
    return 0


def _planned(args, shard: int, shards: int, out) -> list:
    """The plans of ``args``' families that fall in ``shard``, each written to ``out`` (a
    file, or None) as soon as its allocation is planned."""
    rng = random.Random(args.seed)
    rows = []
    for family in args.families.split(","):
        apart = 0   # allocations whose GPUs reach each other only through GPUs left out
        for i, (fam, name, G, gpus) in enumerate(SOURCES[family](args, rng)):
            if i % shards != shard:
                continue
            try:
                planned = [record(fam, name, G, gpus, coll, args.size, args.host_relays)
                           for coll in args.collectives.split(",")]
            except NoFeasiblePlan:
                apart += 1
                continue
            rows += planned
            if out:
                out.writelines(json.dumps(r) + "\n" for r in planned)
                out.flush()
        print(f"# {family}: {sum(r['family'] == family for r in rows)} plans; {apart} "
              f"allocations not connected on their own, skipped", file=sys.stderr)
    return rows


if __name__ == "__main__":
    sys.exit(main())
