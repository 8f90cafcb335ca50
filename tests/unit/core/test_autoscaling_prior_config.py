"""`models[].autoscaling.prior` in a config file (core/autoscaling_spec.py): inline, or the path
of the file `hbmserve autoscale learn` wrote, against the config's folder; a bad one is an
error naming the field. The policy's config (autoscale_config_for) carries it."""

from __future__ import annotations

import pytest
import yaml

from hbmserve.autoscale.policy_config import autoscale_config_for
from hbmserve.core.config import ConfigError, load_cluster_spec, parse_cluster_spec

PRIOR = {"bucket_s": 180.0, "rises_rps": [0.5, 2.0, 9.0], "learned_from": "past.csv (40 buckets of 180 s)"}


def _config(tmp_path, prior) -> str:
    model = {"name": "m", "source": "simulated", "engine": "sim",
             "autoscaling": {"min_replicas": 1, "max_replicas": 4, "prior": prior}}
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"models": [model]}))
    return str(path)


def test_a_prior_inline_or_as_a_file_reaches_the_policy(tmp_path):
    (tmp_path / "priors").mkdir()
    (tmp_path / "priors" / "prior.yaml").write_text("# learnt\n" + yaml.safe_dump(PRIOR))
    for prior in (PRIOR, "priors/prior.yaml"):
        spec = load_cluster_spec(_config(tmp_path, prior))
        auto = autoscale_config_for(spec.models[0])
        assert auto.prior_rises_rps == (0.5, 2.0, 9.0) and auto.prior_source == PRIOR["learned_from"]
    assert autoscale_config_for(load_cluster_spec(_config(tmp_path, None)).models[0]).prior_rises_rps == ()


def test_a_file_that_is_no_prior_and_a_path_never_read_are_refused(tmp_path):
    (tmp_path / "notes.yaml").write_text("just: notes\n")
    with pytest.raises(ConfigError, match=r"models\[0\].autoscaling.prior: .*notes.yaml is not a prior"):
        load_cluster_spec(_config(tmp_path, "notes.yaml"))
    # A spec built from data, not a file, has the path only: the policy's config says so.
    data = yaml.safe_load(open(_config(tmp_path, "prior.yaml")).read())
    with pytest.raises(ValueError, match="is a file path; load the config file"):
        autoscale_config_for(parse_cluster_spec(data).models[0])


@pytest.mark.parametrize("prior, words", [
    ("missing.yaml", ("models[0].autoscaling.prior", "cannot read")),
    ({"bucket_s": 180, "rises_rps": [1.0, -2.0]}, ("rises_rps",)),
    ({"bucket_s": 180, "rises_rps": []}, ("rises_rps",)),
    ({"bucket_s": 180, "rises_rps": ["lots"]}, ("rises_rps",)),
    ({"prometheus": "prometheus:9090"}, ("prometheus", "pattern")),
    ({"prometheus": "http://prometheus:9090", "window_s": 30}, ("window_s", "greater than or equal to 60")),
    ({"prometheus": "http://prometheus:9090", "step": 15}, ("prior.prometheus.step: unknown field",)),
    (5, ("models.0.autoscaling.prior", "dictionary")),
])
def test_a_bad_prior_names_its_field(tmp_path, prior, words):
    with pytest.raises(ConfigError) as err:
        load_cluster_spec(_config(tmp_path, prior))
    for w in words:
        assert w in str(err.value), str(err.value)


def test_a_prior_to_read_from_prometheus_is_kept_for_the_deploy_to_read():
    # The config holds where to read; the policy's config starts empty until the app is built
    # (deployments/apps/autoscaling_options.py live_prior, tests/integration/test_prior_prometheus.py).
    spec = parse_cluster_spec({"models": [{"name": "m", "source": "simulated", "engine": "sim", "autoscaling": {
        "max_replicas": 4, "prior": {"prometheus": "http://prometheus.monitoring:9090", "window_s": 3600}}}]})
    prior = spec.models[0].autoscaling.prior
    assert (prior.prometheus, prior.window_s, prior.step_s) == ("http://prometheus.monitoring:9090", 3600, 15)
    assert autoscale_config_for(spec.models[0]).prior_rises_rps == ()
