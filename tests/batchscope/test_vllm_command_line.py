"""vLLM's command line read back (batchscope.vllm.command_line): every spelling vLLM's parser takes."""

from batchscope.vllm.command_line import flag_values


def test_every_spelling_reads_as_the_flag_it_sets():
    values = flag_values("vllm serve m --max-num-seqs 32 --max_num_batched_tokens=8192 --enforce-eager "
                         "--no-long-prefill-token-threshold-adaptive --port 8000")
    assert values == {"model": "m", "max_num_seqs": "32", "max_num_batched_tokens": "8192", "enforce_eager": "true",
                      "long_prefill_token_threshold_adaptive": "false", "port": "8000"}


def test_the_api_server_module_form_and_a_trailing_flag_without_a_value():
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m", "--long-prefill-token-threshold-"
            "adaptive", "--max-num-queued-reqs", "4", "--trust-remote-code"]
    assert flag_values(argv) == {"model": "m", "long_prefill_token_threshold_adaptive": "true",
                                 "max_num_queued_reqs": "4", "trust_remote_code": "true"}
