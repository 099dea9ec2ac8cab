//! One behaviour suite, instantiated for every store.
#![allow(unreachable_pub, missing_docs)]

mod fixtures;
mod scenarios;
#[path = "../support/mod.rs"]
mod support;

/// Instantiates every scenario as a test against the fixture `$fixture` builds.
macro_rules! behaviour_suite {
    ($store:ident, $fixture:expr) => {
        mod $store {
            #[allow(unused_imports)]
            use super::*;

            behaviour_suite!(@tests $fixture;
                reacquiring_a_held_id_counts_once_and_refreshes_its_lease,
                weights_count_and_a_weight_over_the_limit_can_never_fit,
                weights_as_large_as_the_limit_never_overflow,
                keys_are_opaque,
                an_empty_id_is_refused_and_never_matches,
                // (Dify's layout keeps no tokens.)
                tokens_grow_with_every_admission_on_a_key,
                a_late_release_of_an_earlier_admission_leaves_a_later_ones_lease,
                a_later_admission_of_an_id_takes_its_lease_over,
                in_process_permits_of_one_id_release_with_the_latest_token,
                // (Dify's layout keeps Dify's hash, which neither lists labels nor revokes.)
                holders_are_listed_with_their_labels_from_another_process,
                a_revoked_holder_hears_it_lost_and_its_slot_is_free_at_once,
                a_revoked_waiter_ends_with_revoked_and_leaves_the_queue,
                every_holder_is_listed_across_pages,
                a_permit_revoked_on_one_of_its_keys_leaves_them_all_at_its_renewal,
                // (Nor shadow limits: its hash is Dify's count, which it enforces.)
                a_shadow_limit_admits_past_it_and_counts_exactly_the_excess,
            );
            // (Its keys share a hash tag: braces, which Dify's layout refuses.)
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_refused_admission_on_several_keys_never_takes_a_slot_for_a_moment() {
                crate::scenarios::a_refused_admission_on_several_keys_never_takes_a_slot_for_a_moment($fixture).await;
            }
            behaviour_suite!(@unweighted $fixture);
        }
    };
    // The scenarios that need neither weights nor keys with braces (what Dify's layout leaves out).
    (@unweighted $fixture:expr) => {
        behaviour_suite!(@tests $fixture;
            admits_up_to_the_limit_and_rejects_exactly_at_it,
            dropping_or_releasing_a_permit_frees_its_slot,
            generated_ids_are_uuids_and_given_ids_are_kept,
            two_permits_for_one_id_hold_the_slot_until_the_last_goes,
            a_renewal_without_a_length_keeps_the_leases_own,
            a_retry_under_the_same_id_right_after_a_release_keeps_its_slot,
            a_limit_change_applies_to_the_next_admission_in_every_process,
            the_ceiling_caps_every_override,
            an_override_limits_a_key_that_is_unlimited_by_default,
            an_expired_lease_is_reclaimed_at_the_next_admission,
            a_held_permit_keeps_its_slot_across_many_leases,
            a_renewal_readds_a_lease_the_store_lost,
            a_renewal_marks_the_permit_lost_when_the_key_filled_up,
            remote_renewal_of_a_gone_lease_says_lost,
            a_stream_holds_its_permit_until_it_ends,
            a_stream_dropped_midway_or_before_its_first_item_releases,
            a_stream_that_errors_releases_when_it_ends,
            a_scope_holds_its_permit_until_the_future_completes_or_is_cancelled,
            a_panic_while_holding_a_permit_releases_it,
            one_permit_is_handed_from_phase_to_phase,
            status_of_an_unknown_key_is_empty,
            several_limits_are_taken_together_or_not_at_all,
            classes_of_keys_have_their_own_limits_and_cap_their_overrides,
            a_new_policy_applies_to_the_next_admission_and_held_permits_stay,
            a_permit_on_several_keys_is_renewed_and_released_by_its_recorded_id,
            a_permit_stays_held_when_one_of_its_keys_becomes_limited,
        );

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn many_tasks_never_exceed_the_limit_and_end_at_zero() {
            crate::scenarios::many_tasks_never_exceed_the_limit_and_end_at_zero($fixture).await;
        }

    };
    (@tests $fixture:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                crate::scenarios::$name($fixture).await;
            }
        )*
    };
}

behaviour_suite!(memory, crate::fixtures::MemoryFixture::new());
behaviour_suite!(redis, crate::fixtures::RedisFixture::new());
behaviour_suite!(cluster, crate::fixtures::ClusterFixture::new());

/// Dify's key layout: every scenario but those of weights and of keys with braces, which it refuses.
mod redis_dify {
    #[allow(unused_imports)]
    use super::*;

    behaviour_suite!(@unweighted crate::fixtures::RedisFixture::dify());
}

mod memory_only;
