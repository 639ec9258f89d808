"""The long tier: whole runs that `make test` (CI: 20 minutes on 2 cores, setup included) leaves to `make test-long`,
run before a release and after a change to what they cover.

Chosen by measurement, not by kind: a fresh clone's full suite of 1,900 tests spent 6,150 test-seconds (35.7 min of
wall on 2 cores, pytest alone) when CI leaves pytest about 15. The first cut took the tests of 30 s or more under that
load (the figure beside each), and pytest took 18.4 min. The second took the docs' commands beyond the README, a
second run of what another run in CI covers (a resharding, a memory refusal, a parametrized case), and the benches'
own runs of 19 s or more (pytest 15.4 min); the third the first Ctrl-C's stop and rerun (115 s) and the rest of the
docs' checkpoint commands. CI keeps one run of each capability:
- the quickstart;
- the killed rank's e2e restart and its goodput;
- the real Prometheus;
- the stragglers and `zerotrain top`;
- a second Ctrl-C, which stops every rank at once and keeps the last commit;
- resharding at 2→4 and 3→1;
- LoRA against peft;
- stages 0-3 against AdamW on the built-in GPT and Hugging Face Llama, GPT-2 and Mixtral;
- the README's commands.

An entry is a test's node id (a parametrized test's id names one case); `tests/conftest.py` marks each `long` and
fails the collection when an entry names no test, so a renamed test does not drop out of both tiers unseen."""

from __future__ import annotations

LONG: tuple[str, ...] = (
    # 40 s each: a sweep job's smallest memory run for 20 steps, 15% less refused (bench_memory_sweep.py has 24)
    "tests/bench/test_bench_memory_sweep.py::test_accepted_runs_and_fifteen_percent_less_is_refused[qwen2-stage3-ckpt-padded]",
    "tests/bench/test_bench_memory_sweep.py::test_accepted_runs_and_fifteen_percent_less_is_refused[gpt2-stage2-lora-packed]",
    # 300 s: 288 jobs planned and measured (the sample of 8 runs in make test)
    "tests/bench/test_bench_hf_plan.py::test_the_whole_grid_is_planned_as_torch_allocates_it",
    # 44 s
    "tests/bench/test_bench_checkpoint.py::test_both_modes_save_and_the_figures_are_written",
    # 90 s
    "tests/bench/test_bench_lora.py::test_a_tiny_run_of_zerotrain_and_fsdp2_with_adapters",
    # 50 s: one trial of each restart strategy (the killed-rank e2e covers both in make test)
    "tests/bench/test_bench_in_place.py::test_one_trial_of_each_strategy_names_every_part",
    # 38 s
    "tests/bench/test_bench_operator_scale.py::test_operator_scale_prints_the_operator_and_the_plain_client_figures",
    # 19 s
    "tests/bench/test_bench_plan.py::test_fsdp2_beside_the_plan_is_measured",
    # 26 s
    "tests/bench/test_bench_plan.py::test_nothing_outside_the_plan_survives_a_bf16_step",
    # 41 s
    "tests/bench/test_bench_plan.py::test_the_plan_is_within_five_percent_of_the_measured_peak[False]",
    # 19 s
    "tests/bench/test_bench_plan.py::test_the_plan_is_within_five_percent_of_the_measured_peak[True]",
    # 59 s
    "tests/bench/test_compare_smoke.py::test_hybrid_sharding_beside_fsdp2_hsdp_counts_the_bytes_between_groups",
    # 97 s
    "tests/bench/test_compare_smoke.py::test_tiny_comparison_runs_every_requested_system_and_agrees",
    # 25 s
    "tests/bench/test_gpu_check.py::test_a_wrong_collective_result_fails_only_that_check",
    # 43 s
    "tests/bench/test_gpu_check.py::test_a_wrong_reference_fails_the_parity_checks",
    # 161 s
    "tests/bench/test_gpu_check.py::test_cpu_path_runs_every_phase_and_passes",
    # 39 s
    "tests/bench/test_gpu_check.py::test_the_script_installs_the_wheel_imports_it_and_refuses_one_of_other_sources",
    # 70 s
    "tests/bench/test_gpu_check.py::test_the_script_writes_its_log_and_results_and_exits_with_the_checks_status",
    # 39 s
    "tests/cli/test_cli_pipe.py::test_a_run_writing_to_a_pipe_says_each_logged_step_as_it_happens",
    # 28 s
    "tests/cli/test_validate_entrypoint.py::test_unequal_rows_per_rank_are_said_in_one_line_by_validate_and_run",
    # 33 s
    "tests/docs/test_doc_blocks.py::test_manifest_runs_two_steps[docs/manifest.md:6]",
    # 51 s
    "tests/docs/test_doc_commands.py::test_command[docs/checkpoints.md:157]",
    # with :157 and :160: the first of them runs the job whose checkpoint they read (39 s)
    "tests/docs/test_doc_commands.py::test_command[docs/checkpoints.md:158]",
    # with :157 and :160: the first of them runs the job whose checkpoint they read (39 s)
    "tests/docs/test_doc_commands.py::test_command[docs/checkpoints.md:159]",
    # 22 s
    "tests/docs/test_doc_commands.py::test_command[docs/checkpoints.md:160]",
    # with :157 and :160: the first of them runs the job whose checkpoint they read (39 s)
    "tests/docs/test_doc_commands.py::test_command[docs/checkpoints.md:161]",
    # 18 s
    "tests/docs/test_doc_commands.py::test_command[docs/fine-tuning.md:14]",
    # 18 s
    "tests/docs/test_doc_commands.py::test_command[docs/memory.md:26]",
    # 20 s
    "tests/docs/test_doc_commands.py::test_command[docs/models.md:48]",
    # 227 s
    "tests/e2e/test_elastic_e2e.py::test_a_gang_shrinks_when_a_node_is_lost_and_grows_back_matching_an_uninterrupted_run",
    # 72 s
    "tests/e2e/test_training_e2e.py::test_a_preempted_pod_saves_its_step_and_the_next_gang_resumes_there",
    # 23 s
    "tests/integration/test_custom_example.py::test_the_custom_example_trains_from_anywhere_and_its_loss_falls",
    # its fixture is the llama-tiny chain
    "tests/integration/test_llama_tiny_example.py::test_lora_on_the_export_learns_what_the_base_could_not",
    # over 300 s (stopped at its limit; about 1.5 min alone on 2 idle cores, with the sft-lora chain 3.2 min)
    "tests/integration/test_llama_tiny_example.py::test_the_examples_three_commands_train_export_and_generate",
    # 29 s
    "tests/integration/test_local_without_image.py::test_a_job_without_image_runs_locally",
    # 36 s
    "tests/integration/test_run_command.py::test_a_configuration_the_engine_refuses_exits_2",
    # 67 s
    "tests/integration/test_run_command.py::test_a_local_run_with_shard_groups_trains_and_says_how_it_sharded",
    # 38 s
    "tests/integration/test_run_faults.py::test_a_rank_killed_mid_run_is_named_first_and_its_peer_says_why_it_stopped",
    # 28 s
    "tests/integration/test_run_faults.py::test_a_task_without_tokens_reports_samples_per_second",
    # 53 s
    "tests/integration/test_run_faults.py::test_an_exception_text_with_brackets_prints_verbatim_without_a_traceback",
    # over 300 s (stopped at its limit; 173 s in the CI run of before)
    "tests/integration/test_run_lora.py::test_a_lora_job_saves_its_adapters_resumes_exactly_and_exports_for_peft_and_transformers",
    # 25 s
    "tests/integration/test_run_memory_limit.py::test_a_rank_whose_process_cannot_start_in_its_limit_says_so_without_a_traceback",
    # 36 s
    "tests/integration/test_run_preemption.py::test_a_launcher_killed_outright_leaves_no_rank_behind",
    # 115 s with its fixture's uninterrupted run (a second Ctrl-C stays in CI)
    "tests/integration/test_run_preemption.py::test_a_stop_signal_commits_the_current_step_and_a_rerun_continues_exactly[ctrl-c]",
    # 138 s
    "tests/integration/test_run_preemption.py::test_a_stop_signal_commits_the_current_step_and_a_rerun_continues_exactly[sigterm-launcher]",
    # 67 s
    "tests/integration/test_run_preemption.py::test_a_stop_signal_commits_the_current_step_and_a_rerun_continues_exactly[sigterm-ranks]",
    # 61 s
    "tests/integration/test_run_preemption.py::test_asynchronous_saves_commit_as_they_go_and_a_stop_waits_for_the_one_in_flight",
    # 37 s
    "tests/integration/test_run_pretrained.py::test_a_missing_pretrained_path_is_refused_before_any_rank_starts",
    # 133 s
    "tests/integration/test_run_pretrained.py::test_pretrained_weights_then_the_jobs_own_checkpoint_then_the_weights_again",
    # 66 s
    "tests/integration/test_run_resume.py::test_reported_loss_is_the_global_batch_mean_at_any_world_size",
    # 134 s
    "tests/integration/test_run_resume.py::test_resume_skips_a_corrupt_checkpoint_and_matches_an_uninterrupted_run",
    # 118 s
    "tests/integration/test_run_schedule_evaluation.py::test_a_resumed_run_trains_every_step_at_the_uninterrupted_learning_rate",
    # 137 s
    "tests/integration/test_run_schedule_evaluation.py::test_evaluation_changes_no_training_number",
    # 28 s
    "tests/integration/test_run_smallest_memory.py::test_the_smallest_memory_the_plan_accepts_runs_and_less_is_refused_before_any_rank[hugging-face-lora]",
    # 22 s
    "tests/runtime/checkpoints/test_reshard.py::test_a_checkpoint_from_before_aligned_offsets_loads_and_trains_on_exactly[2to2-stage3]",
    # 19 s
    "tests/runtime/checkpoints/test_reshard.py::test_a_checkpoint_from_before_aligned_offsets_loads_and_trains_on_exactly[2to3-stage1]",
    # 29 s
    "tests/runtime/checkpoints/test_reshard.py::test_a_resharded_load_reads_only_its_ranges_and_trains_on_exactly[4to3-stage3-uneven]",
    # 47 s
    "tests/runtime/construction/test_pretrained.py::test_a_zerotrain_export_and_checkpoint_are_weights_too",
    # 43 s
    "tests/runtime/job/test_host_memory.py::test_weights_freed_while_starting_go_back_to_the_system",
    # 40 s
    "tests/runtime/job/test_process_memory.py::test_the_stated_baseline_is_what_a_rank_holds_besides_its_tensors",
    # 179 s
    "tests/runtime/zero/test_compiled.py::test_compiled_blocks_train_as_eager_and_as_adamw",
    # 40 s
    "tests/runtime/zero/test_stream_order.py::test_lazy_side_stream_trains_as_the_host_order_does[2]",
    # 42 s
    "tests/runtime/zero/test_stream_order.py::test_lazy_side_stream_trains_as_the_host_order_does[4]",
)
