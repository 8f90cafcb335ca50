"""The policy adapters read Serve's context only through `core.serve_context.PolicyContext`:
Ray's own AutoscalingContext and the slotted path's merged `ModelContext` must both carry every
member it names, and nothing in deployments/control/ may read another attribute of a context."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from ray.serve.config import AutoscalingContext

from hbmserve.deployments.control import autoscaling, pool_autoscaling, slot_autoscaling
from hbmserve.deployments.control.slot_autoscaling import ModelContext, model_context
from hbmserve.core.serve_context import POLICY_CONTEXT_MEMBERS, PolicyContext


def test_the_member_list_is_the_protocols():
    declared = {n for n, v in vars(PolicyContext).items() if isinstance(v, property)}
    assert declared == set(POLICY_CONTEXT_MEMBERS)


def test_rays_context_has_every_member():
    """Ray 2.60's AutoscalingContext takes them as constructor arguments and keeps them."""
    params = set(inspect.signature(AutoscalingContext.__init__).parameters)
    assert set(POLICY_CONTEXT_MEMBERS) <= params | set(dir(AutoscalingContext))


def test_the_merged_slot_context_has_every_member():
    ctx, _ = model_context([], 10.0, {}, "app", "engine-m")
    assert isinstance(ctx, ModelContext)
    assert all(hasattr(ctx, name) for name in POLICY_CONTEXT_MEMBERS)


def test_the_adapters_read_no_other_member_of_a_context():
    read = set()
    for module in (autoscaling, slot_autoscaling, pool_autoscaling):
        for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ctx":
                read.add(node.attr)
    assert read and read <= set(POLICY_CONTEXT_MEMBERS), read - set(POLICY_CONTEXT_MEMBERS)
