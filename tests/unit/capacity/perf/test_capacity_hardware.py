"""The hardware catalog: the required profiles exist, prices override, bad files fail clearly."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml

from hbmserve.capacity.perf.hardware import CatalogError, get_gpu, load_catalog, parse_catalog

REQUIRED = ("a100-80g-sxm", "h100-sxm", "h200-sxm", "b200", "l40s", "cpu-local")


def test_catalog_has_required_gpus_with_links_and_prices():
    cat = load_catalog()
    for name in REQUIRED:
        g = cat[name]
        assert g.hbm_bytes > 0 and g.hbm_bw_bytes_s > 0 and g.bf16_flops > 0
        assert g.intra_node.bw_bytes_s > 0 and g.inter_node.bw_bytes_s > 0 and g.host_link.bw_bytes_s > 0
        assert g.usd_per_gpu_hour >= 0


def test_datasheet_numbers_are_in_the_right_units():
    h100 = get_gpu("h100-sxm")
    assert h100.hbm_bytes == 80e9
    assert h100.hbm_bw_bytes_s == 3.35e12
    assert h100.bf16_flops == 989e12
    assert h100.flops_for("fp8") == 1979e12
    assert get_gpu("a100-80g-sxm").flops_for("fp8") == 312e12  # no FP8 tensor cores: BF16 compute
    assert get_gpu("l40s").intra_node.kind.startswith("pcie")  # no NVLink


def test_price_is_overridable():
    assert get_gpu("h100-sxm", usd_per_gpu_hour=1.25).usd_per_gpu_hour == 1.25
    assert get_gpu("h100-sxm").with_price(None).usd_per_gpu_hour == load_catalog()["h100-sxm"].usd_per_gpu_hour


def test_unknown_gpu_lists_known_ones():
    with pytest.raises(CatalogError, match="known: .*h100-sxm"):
        get_gpu("tpu-v9")


def test_bad_catalog_names_field(tmp_path):
    data = yaml.safe_load(resources.files("hbmserve.capacity.perf").joinpath("data", "hardware.yaml").read_text())
    data["gpus"]["h100-sxm"]["hbm_gb"] = -1
    with pytest.raises(CatalogError, match="h100-sxm.hbm_gb"):
        parse_catalog(data, "test")
    p = tmp_path / "c.yaml"
    p.write_text("gpus: [")
    with pytest.raises(CatalogError, match="not valid YAML"):
        load_catalog(p)
