"""Masking secrets in command lines and configs."""

from __future__ import annotations

import pytest

from batchscope.inputs.secrets import MASK, is_secret, mask_argv, mask_command, mask_mapping


@pytest.mark.parametrize("name", ["--api-key", "--hf-token", "api_key", "GRAFANA_PASSWORD", "--grafana-passwd",
                                  "client_secret", "--vllm-api-key"])
def test_names_that_say_key_token_secret_or_password_are_secret(name):
    assert is_secret(name)


@pytest.mark.parametrize("name", ["--max-num-seqs", "--model", "--port", "block_size", "--max-num-batched-tokens",
                                  "--long-prefill-token-threshold", "long_prefill_token_threshold_adaptive",
                                  "--max-num-queued-tokens"])
def test_the_tuning_knobs_are_not_secret(name):
    assert not is_secret(name)


def test_a_knob_whose_name_says_token_keeps_its_value_in_a_command_line():
    argv = ["vllm", "serve", "m", "--long-prefill-token-threshold", "256", "--hf-token", "hf_x"]
    assert mask_argv(argv) == ["vllm", "serve", "m", "--long-prefill-token-threshold", "256", "--hf-token", MASK]


def test_a_command_line_keeps_everything_but_secret_values():
    argv = ["vllm", "serve", "m", "--api-key", "sk-1", "--hf-token=hf_2", "--max-num-seqs", "64", "--api-key"]
    assert mask_argv(argv) == ["vllm", "serve", "m", "--api-key", MASK, f"--hf-token={MASK}", "--max-num-seqs",
                               "64", "--api-key"]


def test_a_boolean_flag_after_a_secret_flag_is_not_taken_for_its_value():
    assert mask_argv(["--api-key", "--enforce-eager"]) == ["--api-key", "--enforce-eager"]


def test_mappings_are_masked_at_every_depth_and_empty_values_stay_empty():
    config = {"api_key": "sk-1", "model": "m", "load": {"token": "t", "rate": 2}, "hf_token": None}
    assert mask_mapping(config) == {"api_key": MASK, "model": "m", "load": {"token": MASK, "rate": 2},
                                    "hf_token": None}


@pytest.mark.parametrize(("command", "masked"), [
    ("vllm serve {model} --api-key sk-1 {flags}", "vllm serve {model} --api-key *** {flags}"),
    ("vllm serve m --hf-token='hf 2' --api-key=sk-3 --chat-template '{a b}'",
     "vllm serve m --hf-token=*** --api-key=*** --chat-template '{a b}'"),
    ("vllm serve m --api-key 'sk-4", "vllm serve m --api-key ***"),  # an open quote: split at whitespace
])
def test_a_command_template_keeps_everything_but_secret_values(command, masked):
    assert mask_command(command) == masked


def test_a_command_without_secrets_is_kept_as_written():
    command = "vllm  serve {model} --port {port} --override-generation-config '{\"temperature\": 0}'"
    assert mask_command(command) == command
