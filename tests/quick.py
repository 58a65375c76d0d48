"""The ``quick`` subset: ``pytest -m quick`` runs these tests (under a minute on an idle 2-core
machine), a check of every module's basics for a change in one of them; the whole suite is
``pytest -m "not slow"``.

Each entry is a file, ``file::test`` (every parametrisation of the test) or ``file::test[params]``
(one of them), and gets the ``quick`` marker in tests/conftest.py. tests/test_quick.py checks that every entry names a test, and that every
module of ``src/hlbl`` is imported by the file of a quick test or by a module such a file imports.
Keep it quick: a test here takes at most about a second.
"""

QUICK = [
    "test_api.py::test_every_public_name_resolves_and_all_lists_exactly_them",
    "test_api.py::test_version_has_one_source",
    "test_atomic.py::test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary",
    "test_checkpoint.py::test_save_load_gives_identical_log_probs_and_tree",
    "test_class_output.py::test_distribution_sums_to_one_and_matches_enumeration",
    "test_cli.py::test_cli_score",
    "test_cli_startup.py::test_help_and_argument_errors_import_no_heavy_module",
    "test_corpus.py::test_bad_input_gives_one_clear_error",
    "test_distributed.py::test_shard_bounds_split_contiguously_and_can_be_empty",
    "test_fast.py::test_one_step_equals_autograd_sgd",
    "test_fast.py::test_scoring_matches_torch",
    "test_function_length.py",
    "test_fuzz.py::test_stdin_lines_are_read_by_the_corpus_rules",
    "test_jit.py::test_a_compilation_is_logged_once_with_its_seconds",
    "test_layer.py::test_both_log_prob_paths_equal_the_enumeration",
    "test_layer.py::test_hidden_features_are_the_exact_mean_hidden_vector_of_each_word",
    "test_memory.py::test_small_arrays_are_left_alone",
    "test_mixture.py::test_a_mixture_scores_sentences_as_its_models_mixed_per_token",
    "test_model.py::test_forward_agrees_with_log_prob",
    "test_ngram.py::test_arpa_round_trip",
    "test_ngram.py::test_binary_form_round_trip_and_errors",
    "test_ngram.py::test_discounts_by_hand",
    "test_output.py::test_distribution_sums_to_one",
    "test_progress.py::test_log_lines_come_every_interval_and_not_for_short_steps",
    "test_quick.py",
    "test_refine.py::test_gains_equal_the_change_of_the_training_nll",
    "test_reproduce.py::test_bad_options_are_one_line_errors",
    "test_sampled_output.py::test_nce_loss_and_gradients_match_the_formula",
    "test_sampling.py::test_generate_is_reproducible",
    "test_scan.py::test_bad_utf8_is_what_pythons_decoder_rejects",
    "test_sync.py::test_the_means_land_a_round_late_on_the_rows_caught_up_since",
    "test_scoring.py::test_score_sentences_follows_the_protocol",
    "test_search.py::test_topk_equals_brute_force[huffman-1.0]",
    "test_search.py::test_topk_equals_brute_force[duplicated-0.05]",
    "test_serve.py::test_health_and_model_describe_the_run",
    "test_serve_limits.py::test_heads_within_the_caps_are_answered",
    "test_split.py::test_every_line_lands_in_exactly_one_split_in_file_order",
    "test_streams.py::test_contexts_are_padded_with_eos",
    "test_structure.py",
    "test_train.py::test_perplexity_report_is_exp_of_mean_nll",
    "test_train.py::test_train_config_round_trips_through_json_and_refuses_unknown_settings",
    "test_tree.py::test_codes_follow_the_documented_layout",
    "test_tree.py::test_huffman_is_optimal_on_a_known_case",
    "test_treebuild.py::test_em_recovers_two_blobs",
    "test_vocab.py::test_vocabulary_rules",
]
