"""Bad device input is refused before the first collective, naming the setting and the fix: GPUs asked for where
there are none, bf16 on a GPU that cannot compute in it, a process group that cannot carry the model's tensors."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from test_train_loop import job_spec

from zerotrain.runtime.job.rank import init_process_group
from zerotrain.runtime.job.spec_bindings import device_for
from zerotrain.runtime.job.task import ConfigError
from zerotrain.runtime.job.train import RankContext
from zerotrain.runtime.zero.engine_errors import ZeroSetupError
from zerotrain.runtime.zero.process_group import check_backend_serves, check_local_gpu, control_device
from zerotrain.runtime.zero.setup_checks import check_precision
from zerotrain.zero_config import Precision


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_gpus_asked_for_on_a_rank_without_cuda_fail_before_the_group_forms() -> None:
    spec = job_spec(resources={"gpu": 1})
    with pytest.raises(ConfigError) as e:
        init_process_group(spec, RankContext(0, 1, 0))
    assert "spec.resources.gpu: got 1" in str(e.value) and "resources.gpu: 0" in str(e.value), e.value
    assert not dist.is_initialized()


def test_a_cpu_job_trains_on_the_cpu_whatever_the_machine_has() -> None:
    assert device_for(job_spec(), 0) == torch.device("cpu")


@pytest.mark.parametrize(
    ("backend", "device", "refused"),
    [
        ("nccl", "cpu", True),
        ("gloo", "cuda", True),
        ("cpu:gloo,cuda:nccl", "cpu", False),
        ("cpu:gloo,cuda:nccl", "cuda", False),
        ("gloo", "cpu", False),
    ],
)
def test_a_group_that_cannot_carry_the_model_is_refused(backend: str, device: str, refused: bool) -> None:
    if not refused:
        check_backend_serves(backend, torch.device(device))
        return
    with pytest.raises(ZeroSetupError) as e:
        check_backend_serves(backend, torch.device(device))
    message = str(e.value)
    assert message.startswith(f"process group backend: got {backend!r}") and f"serve {device} tensors" in message
    assert "cpu:gloo,cuda:nccl" in message


def test_bf16_on_a_gpu_without_it_is_refused_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Tesla V100-SXM2-32GB")
    with pytest.raises(ZeroSetupError) as e:
        check_precision(Precision.BF16, torch.device("cuda", 0))
    assert "zero.precision: got 'bf16'" in str(e.value) and "V100" in str(e.value) and "fp16" in str(e.value)
    check_precision(Precision.FP16, torch.device("cuda", 0))
    check_precision(Precision.BF16, torch.device("cpu"))  # the CPU computes in bf16


def test_a_model_on_several_devices_or_none_is_refused() -> None:
    from zerotrain.runtime.zero.setup_checks import model_device
    from zerotrain.zero_config import ZeroConfig

    split = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2, device="meta"))
    with pytest.raises(ZeroSetupError, match="several devices"):
        model_device(split, ZeroConfig())
    with pytest.raises(ZeroSetupError, match="no parameters"):
        model_device(torch.nn.ReLU(), ZeroConfig())
    assert model_device(torch.nn.Linear(2, 2), ZeroConfig()) == torch.device("cpu")


@pytest.mark.parametrize(
    ("device", "local_rank", "visible", "refused"),
    [
        (0, 1, 8, True),  # model.cuda() without set_device: every rank of the node on cuda:0
        (1, 1, 8, False),
        (0, 3, 1, False),  # CUDA_VISIBLE_DEVICES gives each process its own GPU as cuda:0
        (0, 0, 2, False),
        (3, None, 8, False),  # no LOCAL_RANK (srun, mpirun): the launcher's own mapping stands
    ],
)
def test_a_rank_on_another_local_ranks_gpu_is_refused_naming_the_fix(
    device: int, local_rank: int | None, visible: int, refused: bool
) -> None:
    env = {} if local_rank is None else {"LOCAL_RANK": str(local_rank)}
    gpu = torch.device("cuda", device)
    if not refused:
        assert check_local_gpu(gpu, env, visible) == gpu
        return
    with pytest.raises(ZeroSetupError) as e:
        check_local_gpu(gpu, env, visible)
    message = str(e.value)
    assert message.startswith("model device: got 'cuda:0'") and "Duplicate GPU" in message, message
    assert f"torch.cuda.set_device({local_rank})" in message and f"model.to('cuda:{local_rank}')" in message


@pytest.mark.parametrize(
    ("backend", "model", "control"),
    [("nccl", "cuda", "cuda"), ("cpu:gloo,cuda:nccl", "cuda", "cpu"), ("gloo", "cpu", "cpu")],
)
def test_the_divergence_checks_tensors_go_where_the_group_serves_them(backend: str, model: str, control: str) -> None:
    # A plain init_process_group("nccl") serves no CPU tensors: the check's int64 all-gathers go to the GPU.
    assert control_device(backend, torch.device(model)).type == control
