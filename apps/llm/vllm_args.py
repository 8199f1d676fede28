"""The keyword arguments vLLM accepts in serve.llm's `engine_kwargs`.

serve.llm splits `engine_kwargs` between vLLM's FrontendArgs and AsyncEngineArgs and raises
"Unknown engine argument: <key>" for anything else (VLLMEngineConfig.from_llm_config in
ray/llm/_internal/serve/engines/vllm/vllm_models.py). Ray 2.60 pins vllm 0.29.0 and imports FrontendArgs from
vllm.entrypoints.launchers.cli_args; the names below are the dataclass fields at vllm-project/vllm@5606eaf
(vllm/engine/arg_utils.py EngineArgs and AsyncEngineArgs, vllm/entrypoints/launchers/cli_args.py
BaseFrontendArgs and FrontendArgs), the newest stored vLLM with that layout. Update them with the vLLM pin.
"""

from __future__ import annotations

VLLM_ARGS_SOURCE = "vllm-project/vllm@5606eaf (the vLLM layout Ray 2.60 imports; Ray pins vllm 0.29.0)"

ENGINE_ARGS = frozenset(
    """
    model enable_return_routed_experts return_sampling_mask model_weights served_model_name tokenizer
    hf_config_path runner convert skip_tokenizer_init enable_prompt_embeds tokenizer_mode trust_remote_code
    allowed_local_media_path allowed_media_domains download_dir safetensors_load_strategy
    safetensors_prefetch_num_threads safetensors_prefetch_block_size load_format config_format dtype
    kv_cache_dtype seed max_model_len cudagraph_capture_sizes max_cudagraph_capture_size ir_op_priority
    distributed_executor_backend pipeline_parallel_size master_addr master_port nnodes node_rank
    distributed_timeout_seconds cpu_distributed_timeout_seconds numa_bind numa_bind_nodes numa_bind_cpus
    device_ids tensor_parallel_size prefill_context_parallel_size decode_context_parallel_size
    dcp_comm_backend dcp_q_replicate dcp_kv_cache_interleave_size cp_kv_cache_interleave_size
    data_parallel_size data_parallel_rank data_parallel_start_rank data_parallel_size_local
    data_parallel_address data_parallel_rpc_port data_parallel_hybrid_lb data_parallel_external_lb
    data_parallel_multi_port_external_lb data_parallel_backend enable_expert_parallel
    enable_batch_sharded_sampling enable_ep_weight_filter moe_backend linear_backend all2all_backend
    enable_elastic_ep enable_dbo ubatch_size dbo_decode_token_threshold dbo_prefill_token_threshold
    disable_nccl_for_dp_synchronization eplb_config enable_eplb expert_placement_strategy
    _api_process_count _api_process_rank max_parallel_loading_workers block_size enable_prefix_caching
    prefix_caching_hash_algo prefix_cache_retention_interval disable_sliding_window disable_cascade_attn
    offload_backend cpu_offload_gb cpu_offload_params offload_group_size offload_num_in_group
    offload_prefetch_step offload_params gpu_memory_utilization kv_cache_memory_bytes max_num_batched_tokens
    max_num_scheduled_tokens long_prefill_token_threshold max_num_seqs max_logprobs logprobs_mode
    use_fp64_gumbel enable_trace_replay disable_log_stats aggregate_engine_logging revision code_revision
    hf_token hf_overrides model_class_overrides tokenizer_revision quantization quantization_config
    allow_deprecated_quantization enforce_eager disable_custom_all_reduce language_model_only
    limit_mm_per_prompt enable_mm_embeds interleave_mm_strings media_io_kwargs mm_processor_kwargs
    mm_processor_cache_gb mm_processor_cache_type mm_hasher_algorithm mm_shm_cache_max_object_size_mb
    mm_encoder_only mm_encoder_tp_mode mm_encoder_attn_backend mm_encoder_attn_dtype mm_encoder_fp8_scale_path
    mm_encoder_fp8_scale_save_path mm_encoder_fp8_scale_save_margin io_processor_plugin renderer_num_workers
    skip_mm_profiling video_pruning_rate video_pruning_method mm_tensor_ipc mm_processor_device
    mm_ipc_gpu_memory_gb mm_device_do_normalize enable_lora max_loras max_lora_rank default_mm_loras
    fully_sharded_loras max_cpu_loras lora_dtype lora_target_modules enable_tower_connector_lora
    specialize_active_lora enable_mixed_moe_lora_format enable_moe_shared_loras ray_workers_use_nsight
    num_gpu_blocks_override model_loader_extra_config ignore_patterns enable_chunked_prefill
    disable_chunked_mm_input scheduler_reserve_full_isl prefill_schedule_interval watermark
    disable_hybrid_kv_cache_manager structured_outputs_config reasoning_parser reasoning_parser_plugin
    speculative_config spec_method spec_model spec_tokens diffusion_config show_hidden_metrics_for_version
    otlp_traces_endpoint token_level_profiling collect_detailed_traces per_request_spec_decode_metrics
    kv_cache_metrics kv_cache_metrics_sample cudagraph_metrics enable_layerwise_nvtx_tracing enable_mfu_metrics
    enable_logging_iteration_details jit_monitor_mode jit_monitor_verbose enable_mm_processor_stats
    scheduling_policy scheduler_cls pooler_config compilation_config attention_config mamba_config
    kernel_config enable_flashinfer_autotune enable_bf16x3_router_gemm worker_cls worker_extension_cls
    profiler_config kv_transfer_config kv_events_config ec_transfer_config ec_manager_config reasoning_config
    generation_config enable_sleep_mode enable_cumem_allocator override_generation_config model_impl
    attention_backend kv_cache_dtype_skip_layers mamba_cache_dtype mamba_ssm_cache_dtype mamba_block_size
    prefix_match_unit mamba_cache_mode replayssm_buffer_len use_replayssm mamba_backend mamba_ssu_algorithm
    enable_mamba_cache_stochastic_rounding mamba_cache_philox_rounds additional_config use_tqdm_on_load
    pt_load_map_location logits_processors async_scheduling stream_interval kv_sharing_fast_prefill
    optimization_level performance_mode fault_tolerance_config enable_fault_tolerance kv_offloading_size
    kv_offloading_backend tokens_only shutdown_timeout weight_transfer_config fail_on_environ_validation
    gdn_prefill_backend kda_prefill_backend
    enable_log_requests
    """.split()
)

FRONTEND_ARGS = frozenset(
    """
    lora_modules chat_template chat_template_content_format trust_request_chat_template
    default_chat_template_kwargs response_role return_tokens_as_token_ids enable_auto_tool_choice
    exclude_tools_when_tool_choice_none tool_call_parser tool_parser_plugin tool_server log_config_file
    max_log_len enable_prompt_tokens_details enable_per_request_metrics enable_server_load_tracking
    enable_force_include_usage sse_keep_alive_interval enable_tokenizer_info_endpoint enable_log_outputs
    enable_log_deltas cohere_is_reasoning_model cohere_format log_error_stack tokens_only fingerprint_mode
    fingerprint_value
    host port data_parallel_supervisor_port dp_supervisor_probe_interval_s dp_supervisor_probe_timeout_s
    dp_supervisor_probe_failure_threshold uds uvicorn_log_level disable_uvicorn_access_log
    disable_access_log_for_endpoints allow_credentials allowed_origins allowed_methods allowed_headers api_key
    ssl_keyfile ssl_certfile ssl_ca_certs enable_ssl_refresh ssl_cert_reqs ssl_ciphers root_path middleware
    enable_request_id_headers disable_fastapi_docs h11_max_incomplete_event_size h11_max_header_count
    enable_offline_docs enable_flash_late_interaction
    """.split()
)

KNOWN_ENGINE_KWARGS = ENGINE_ARGS | FRONTEND_ARGS
