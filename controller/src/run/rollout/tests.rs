use super::*;

fn status(revision: &str, since: &str, programmed: u32, nodes: u32) -> RolloutStatus {
    RolloutStatus {
        revision: revision.to_owned(),
        resource_version: Some(since.to_owned()),
        nodes,
        programmed,
        progress: format!("{programmed}/{nodes}"),
        slowest: None,
        written_time: None,
        complete_time: None,
    }
}

fn marks(rollouts: &mut Rollouts, marks: &[(&str, &str)]) {
    for (node, mark) in marks {
        rollouts.node_mark(node, Some(mark));
    }
}

#[tokio::test(start_paused = true)]
async fn a_rollout_every_node_reports_costs_one_write_when_it_completes() {
    let mut r = Rollouts::new(Duration::from_secs(15), StatusWrites::All);
    marks(&mut r, &[("a", "90"), ("b", "95"), ("c", "99")]);
    let t0 = Instant::now();
    r.wrote("ns/web", "r1", "100", t0);
    assert_eq!(r.due(t0), Some(t0));
    let (updates, done) = r.updates(t0);
    assert!(
        updates.is_empty() && done.is_empty(),
        "not slow yet: {updates:?}"
    );
    assert_eq!(r.incomplete(), 1);

    // Two of three report; nothing written before it is slow.
    tokio::time::advance(Duration::from_secs(1)).await;
    marks(&mut r, &[("a", "100"), ("b", "130")]);
    assert!(r.updates(Instant::now()).0.is_empty());

    tokio::time::advance(Duration::from_secs(1)).await;
    marks(&mut r, &[("c", "101")]);
    let (updates, done) = r.updates(Instant::now());
    assert_eq!(updates.len(), 1);
    let written = &updates[0].status;
    assert_eq!(
        (written.revision.as_str(), written.programmed, written.nodes),
        ("r1", 3, 3)
    );
    assert_eq!(written.progress, "3/3");
    assert_eq!(written.slowest, None);
    assert_eq!(written.resource_version.as_deref(), Some("100"));
    assert!(written.complete_time.is_some());
    assert_eq!(
        done,
        vec![Completed {
            plan: "ns/web".to_owned(),
            revision: "r1".to_owned(),
            seconds: 2.0
        }]
    );
    r.written(&updates[0], Instant::now());
    assert_eq!(r.incomplete(), 0);

    // Later marks, and the watch echoing the status, write nothing more.
    r.observed("ns/web", "r1", Some("140"), Some(written));
    marks(&mut r, &[("a", "200")]);
    assert!(r.updates(Instant::now()).0.is_empty());
    // Nor does a node joining (its first mark covers every plan).
    marks(&mut r, &[("d", "200")]);
    assert!(r.updates(Instant::now()).0.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_stopped_node_is_named_slowest_after_slow_after_and_rewritten_rarely() {
    let mut r = Rollouts::new(Duration::from_secs(2), StatusWrites::All);
    marks(
        &mut r,
        &[("node-a", "50"), ("node-b", "50"), ("node-c", "50")],
    );
    let t0 = Instant::now();
    r.wrote("ns/web", "r1", "60", t0);
    marks(&mut r, &[("node-a", "60"), ("node-c", "61")]);
    assert!(r.updates(t0).0.is_empty());
    assert_eq!(r.due(t0), Some(t0 + Duration::from_secs(2)));

    tokio::time::advance(Duration::from_secs(2)).await;
    let (updates, _) = r.updates(Instant::now());
    assert_eq!(updates.len(), 1, "{updates:?}");
    let slow = &updates[0].status;
    assert_eq!(slow.progress, "2/3");
    assert_eq!(slow.slowest.as_deref(), Some("node-b"));
    r.written(&updates[0], Instant::now());

    // The same picture is not written again; a changed one waits REWRITE_EVERY.
    r.wrote("ns/other", "o1", "70", Instant::now());
    marks(&mut r, &[("node-a", "70"), ("node-c", "70")]);
    tokio::time::advance(Duration::from_secs(3)).await;
    let (updates, _) = r.updates(Instant::now());
    assert_eq!(
        updates.iter().map(|u| u.plan.as_str()).collect::<Vec<_>>(),
        ["ns/other"],
        "ns/web unchanged"
    );
    assert_eq!(updates[0].status.slowest.as_deref(), Some("node-b"));

    // The stopped node comes back: both complete.
    marks(&mut r, &[("node-b", "70")]);
    let (updates, _) = r.updates(Instant::now());
    assert_eq!(updates.len(), 2);
    assert!(updates.iter().all(|u| u.status.progress == "3/3"));
}

#[tokio::test(start_paused = true)]
async fn a_revision_overtaken_before_it_is_slow_is_never_written() {
    let mut r = Rollouts::new(Duration::from_secs(15), StatusWrites::All);
    marks(&mut r, &[("a", "10"), ("b", "10")]);
    r.wrote("ns/web", "r1", "20", Instant::now());
    tokio::time::advance(Duration::from_secs(5)).await;
    r.wrote("ns/web", "r2", "30", Instant::now());
    marks(&mut r, &[("a", "30"), ("b", "31")]);
    let (updates, _) = r.updates(Instant::now());
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].status.revision, "r2");
    assert_eq!(updates[0].status.resource_version.as_deref(), Some("30"));
}

#[tokio::test(start_paused = true)]
async fn a_restarted_controller_takes_the_write_version_from_the_status() {
    let mut r = Rollouts::new(Duration::from_secs(15), StatusWrites::All);
    marks(&mut r, &[("a", "120"), ("b", "100")]);
    // Complete for its current revision: nothing to do.
    r.observed(
        "ns/done",
        "r1",
        Some("110"),
        Some(&status("r1", "90", 2, 2)),
    );
    // The status is about an older revision: the object's version is the bound, and
    // a found plan is slow at once.
    r.observed("ns/new", "r2", Some("115"), Some(&status("r1", "90", 2, 2)));
    // Status about this revision, incomplete: its write version counts, not the
    // object's (which the status write itself moved).
    r.observed(
        "ns/half",
        "r3",
        Some("119"),
        Some(&status("r3", "100", 1, 2)),
    );
    let (updates, done) = r.updates(Instant::now());
    assert!(done.is_empty(), "found at start: not timed");
    let by_plan: Vec<(&str, &str, Option<&str>)> = updates
        .iter()
        .map(|u| {
            (
                u.plan.as_str(),
                u.status.progress.as_str(),
                u.status.slowest.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        by_plan,
        [("ns/half", "2/2", None), ("ns/new", "1/2", Some("b"))]
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_write_is_tried_again_later_not_at_once() {
    let mut r = Rollouts::new(Duration::from_secs(1), StatusWrites::All);
    marks(&mut r, &[("a", "10")]);
    r.wrote("ns/web", "r1", "10", Instant::now());
    let (updates, _) = r.updates(Instant::now());
    assert_eq!(updates.len(), 1);
    r.failed(&updates[0], Instant::now());
    assert!(r.updates(Instant::now()).0.is_empty());
    assert_eq!(r.due(Instant::now()), Some(Instant::now() + REWRITE_EVERY));
    tokio::time::advance(REWRITE_EVERY).await;
    assert_eq!(r.updates(Instant::now()).0.len(), 1);
    // Nodes that report nothing make no rollout.
    let mut empty = Rollouts::new(Duration::from_secs(1), StatusWrites::All);
    empty.wrote("ns/web", "r1", "10", Instant::now());
    assert!(empty.updates(Instant::now()).0.is_empty());
    empty.node_mark("a", Some("not-a-number"));
    assert_eq!(empty.nodes(), 0);
}

#[tokio::test(start_paused = true)]
async fn by_default_only_lagging_rollouts_and_their_completion_are_written() {
    let mut r = Rollouts::new(Duration::from_secs(2), StatusWrites::Lagging);
    marks(&mut r, &[("a", "10"), ("b", "10")]);
    // Every node in time: nothing written, but timed for the metrics.
    let t0 = Instant::now();
    r.wrote("ns/web", "r1", "20", t0);
    tokio::time::advance(Duration::from_millis(500)).await;
    marks(&mut r, &[("a", "20"), ("b", "21")]);
    let (updates, done) = r.updates(Instant::now());
    assert!(updates.is_empty(), "{updates:?}");
    assert_eq!(done.len(), 1);
    assert_eq!(r.incomplete(), 0);

    // One lags: written as lagging, then as complete.
    r.wrote("ns/web", "r2", "30", Instant::now());
    marks(&mut r, &[("a", "30")]);
    tokio::time::advance(Duration::from_secs(2)).await;
    let (updates, _) = r.updates(Instant::now());
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].status.slowest.as_deref(), Some("b"));
    r.written(&updates[0], Instant::now());
    r.observed("ns/web", "r2", Some("31"), Some(&updates[0].status));
    marks(&mut r, &[("b", "30")]);
    let (updates, _) = r.updates(Instant::now());
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].status.progress, "2/2");

    // Off: nothing, ever; the metrics still see the rollouts.
    let mut off = Rollouts::new(Duration::from_secs(1), StatusWrites::Off);
    marks(&mut off, &[("a", "1")]);
    off.wrote("ns/web", "r1", "5", Instant::now());
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(off.updates(Instant::now()).0.is_empty());
    assert_eq!(off.incomplete(), 1);
    marks(&mut off, &[("a", "5")]);
    let (updates, done) = off.updates(Instant::now());
    assert!(updates.is_empty());
    assert_eq!(done.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_lagging_rollout_with_nothing_new_to_say_is_not_looked_at_again_until_a_mark_moves() {
    for writes in [StatusWrites::Lagging, StatusWrites::Off] {
        let mut r = Rollouts::new(Duration::from_secs(2), writes);
        marks(&mut r, &[("a", "10"), ("b", "10")]);
        r.wrote("ns/web", "r1", "20", Instant::now());
        marks(&mut r, &[("a", "20")]);
        tokio::time::advance(Duration::from_secs(2)).await;
        let (updates, _) = r.updates(Instant::now());
        for update in &updates {
            r.written(update, Instant::now());
        }
        // Past the rewrite time the picture is the same: one look, then nothing is due
        // (no spinning while a node stays stopped).
        tokio::time::advance(REWRITE_EVERY).await;
        let now = Instant::now();
        if let Some(due) = r.due(now) {
            assert!(due <= now);
            assert!(r.updates(now).0.is_empty(), "{writes:?}");
        }
        assert_eq!(r.due(Instant::now()), None, "{writes:?}: settled");
        // A mark moving makes it looked at again.
        marks(&mut r, &[("b", "20")]);
        assert!(r.due(Instant::now()).is_some());
        let (_, done) = r.updates(Instant::now());
        assert_eq!(done.len(), 1, "{writes:?}");
        assert_eq!(r.incomplete(), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn rewrites_and_stale_events_keep_the_first_write_and_count_it_once() {
    let mut r = Rollouts::new(Duration::from_secs(15), StatusWrites::All);
    marks(&mut r, &[("a", "10")]);
    r.wrote("ns/web", "r2", "30", Instant::now());
    // The same content written again later (a repair of managedFields): the rollout
    // is still the first write's, which is what the marks reach.
    r.wrote("ns/web", "r2", "35", Instant::now());
    // A late event of the revision before is no news.
    r.observed("ns/web", "r1", Some("25"), None);
    marks(&mut r, &[("a", "30")]);
    let (updates, done) = r.updates(Instant::now());
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].status.revision, "r2");
    assert_eq!(updates[0].status.resource_version.as_deref(), Some("30"));
    assert_eq!(done.len(), 1);
    // The write fails and is tried again: counted once in the metrics.
    r.failed(&updates[0], Instant::now());
    tokio::time::advance(REWRITE_EVERY).await;
    let (updates, done) = r.updates(Instant::now());
    assert_eq!(updates.len(), 1);
    assert!(done.is_empty(), "already counted");
    // Refused for good (no status subresource): not tried again.
    r.gave_up(&updates[0]);
    tokio::time::advance(REWRITE_EVERY).await;
    assert!(r.updates(Instant::now()).0.is_empty());
    assert_eq!(r.incomplete(), 0);
}
