"""Speed, memory and FLOPs benchmarks, each ``python -m fairseq_sparse.bench.NAME`` (scripts, not tests):
``run`` (throughput vs stock fairseq and softmax), ``memory``, ``operations``, ``flops``, ``l0drop``,
``profile_decode``, ``cuda_equality`` and ``gpu_report`` (all of them on a GPU, one report);
``common`` holds their shared batches, models and interleaved timing. Parts of two scripts, not run
alone: ``run_jobs``, ``long_lengths`` and ``run_report`` (run's measurements and tables); ``gpu_plan``,
``gpu_steps``, ``gpu_checks`` and ``gpu_markdown`` (the GPU report's plan, steps, training check and file)."""
