"""Hierarchical cohorts (DESIGN §2): one table of cases per rule, each named after the rule it shows.

The cases use ``check`` from the flat tables: the input is left unchanged, the decision is the same
when asked twice, and every waiting job is admitted, pending or rejected. Trees are drawn as
``root: ml(cap){research(cap){t1}}, w`` in the comments.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from airflow_quota_provider.policy import CohortUsage, decide, summarize, summarize_cohorts
from airflow_quota_provider.policy.capacity import usage_for
from tests.policy.builders import queue
from tests.policy.test_decide import check, reason_of

ADMISSION = [
    pytest.param(
        # root: ml(0){t1 4, t2 4}
        queue(8).cohort("ml").quota("t1", 4, cohort="ml").quota("t2", 4, cohort="ml").wait("j1", "t1", 6).build(),
        ["j1"],
        id="a team borrows idle capacity of a sibling in its cohort",
    ),
    pytest.param(
        # root: ml(8){t1 0}: the team owns nothing, its cohort owns the GPUs
        queue(8).cohort("ml", capacity=8).quota("t1", 0, cohort="ml").wait("j1", "t1", 8).build(),
        ["j1"],
        id="a team uses its cohort's own capacity",
    ),
    pytest.param(
        # root: ml(0, lend_limit 2){t1 8}, w 8: w may use 2 of ml's 8, never more
        queue(16).cohort("ml", lend_limit=2).quota("t1", 8, cohort="ml").quota("w", 8)
        .wait("big", "w", 11, 9).wait("fits", "w", 10, 0).build(),
        ["fits"],
        id="lend_limit at a cohort keeps the rest of its subtree private",
    ),
    pytest.param(
        # root: ml(0, borrow_limit 2){t1 4, t2 4}, w 8 idle: ml's subtree holds at most 8 + 2
        queue(16).cohort("ml", borrow_limit=2).quota("t1", 4, cohort="ml").quota("t2", 4, cohort="ml").quota("w", 8)
        .run("t2a", "t2", 4).wait("j1", "t1", 7, submitted_at=0).wait("j2", "t1", 6, submitted_at=1).build(),
        ["j2"],
        id="borrow_limit at a cohort caps what its subtree borrows from the rest of the tree",
    ),
    pytest.param(
        # root: ml(0){research(0, lend_limit 0){t1 4}, t2 0}: research lends nothing even inside ml
        queue(8).cohort("ml").cohort("research", "ml", lend_limit=0).quota("t1", 4, cohort="research")
        .quota("t2", 0, cohort="ml").quota("w", 4).wait("j1", "t2", 5).wait("j2", "t2", 4).build(),
        ["j2"],
        id="lend limits hold at every level of the tree",
    ),
    pytest.param(
        # root: ml(4){t1 0}, b 4: both borrow, t1a within its cohort, b1 from the root (what ml lends)
        queue(8).cohort("ml", capacity=4).quota("t1", 0, cohort="ml").quota("b", 4)
        .wait("b1", "b", 8, 9, submitted_at=0).wait("t1a", "t1", 4, 0, submitted_at=5).build(),
        ["t1a"],
        id="a job borrowing within its cohort goes before one borrowing from higher up",
    ),
]


@pytest.mark.parametrize(("state", "admit"), ADMISSION)
def test_admission(state, admit):
    check(state, 100.0, admit, [])


RECLAIM = [
    pytest.param(
        # root: ml(0){research(8){t1 0}}, web(0){serving(0){s1 8}}: s1 borrows research's 8
        queue(16).cohort("ml").cohort("research", "ml", capacity=8).cohort("web").cohort("serving", "web")
        .quota("t1", 0, cohort="research").quota("s1", 8, cohort="serving")
        .run("s_old", "s1", 8, 5, started_at=1).run("s_new", "s1", 4, 5, started_at=9).run("s_mid", "s1", 4, 5, started_at=5)
        .wait("t1a", "t1", 4, 0).build(),
        [], [("s_new", "t1a", "reclaim")],
        id="long-range reclaim across two levels of cohorts",
    ),
    pytest.param(
        # root: ml(8){t1 0}, w 0: w borrows the cohort's capacity while the team does not use it
        queue(8).cohort("ml", capacity=8).quota("t1", 0, cohort="ml").quota("w", 0)
        .run("w1", "w", 4, 9).run("w2", "w", 4, 9, started_at=5).wait("t1a", "t1", 4, 0).build(),
        [], [("w2", "t1a", "reclaim")],
        id="a cohort's own capacity goes back to its children first",
    ),
    pytest.param(
        # root: ml(0){m1 4, m2 4}, w 4, t 4: m2 borrows from m1 inside ml, which is within its share
        queue(16).cohort("ml").quota("m1", 4, cohort="ml").quota("m2", 4, cohort="ml").quota("w", 4).quota("t", 4)
        .run("m2a", "m2", 8, 0).run("wa", "w", 8, 9).wait("ta", "t", 4, 5).build(),
        [], [("wa", "ta", "reclaim")],
        id="a subtree within its share is pruned from the victim search",
    ),
    pytest.param(
        queue(16).cohort("ml").quota("m1", 4, cohort="ml").quota("m2", 4, cohort="ml").quota("w", 4)
        .quota("t", 4, reclaim="lower_priority")
        .run("m2a", "m2", 8, 0).run("wa", "w", 8, 9).wait("ta", "t", 4, 5).build(),
        [], [],
        id="a borrowing team inside a cohort within its share is spared, even at the lowest priority",
    ),
    pytest.param(
        # root: ml(0){m1 4, m2 4}, t 4, common 4: m2 uses m1's 4, t the common pool; taking t's job
        # would leave ml above its share, so m1 takes back what it lent to its sibling
        queue(16).cohort("ml").quota("m1", 4, cohort="ml").quota("m2", 4, cohort="ml").quota("t", 4)
        .run("m2a", "m2", 8, 0).run("ta", "t", 8, 9).wait("m1a", "m1", 4, 5).build(),
        [], [("m2a", "m1a", "reclaim")],
        id="a team reclaims what it lent to a sibling, not what another subtree borrows from the common pool",
    ),
    pytest.param(
        # root: web(8){w1 0}, ops(8){o1 0}, ml(8){t1 0}: web borrows 6 of ml's, ops 2
        queue(24).cohort("web", capacity=8).cohort("ops", capacity=8).cohort("ml", capacity=8)
        .quota("w1", 0, cohort="web").quota("o1", 0, cohort="ops").quota("t1", 0, cohort="ml")
        .run("wa", "w1", 12, 9).run("wb", "w1", 2, 9, started_at=10).run("oa", "o1", 8, 0).run("ob", "o1", 2, 0)
        .wait("t1a", "t1", 2, 0).build(),
        [], [("wb", "t1a", "reclaim")],
        id="reclaim takes first from the subtree that borrows most, whatever the priorities",
    ),
    pytest.param(
        # root: ml(4){research(4){t1 0}, i1 0}, w 4: i1 borrows inside ml, w from the root
        queue(12).cohort("ml", capacity=4).cohort("research", "ml", capacity=4).quota("t1", 0, cohort="research")
        .quota("i1", 0, cohort="ml").quota("w", 4)
        .run("i1a", "i1", 4, 0).run("wa", "w", 4, 9).run("wb", "w", 4, 9, started_at=5).wait("t1a", "t1", 4, 5).build(),
        [], [("wb", "t1a", "reclaim")],
        id="reclaim takes first from the subtree farthest away in the tree",
    ),
    pytest.param(
        queue(12).cohort("ml", capacity=4).cohort("research", "ml", capacity=4)
        .quota("t1", 0, cohort="research", reclaim="lower_priority")
        .quota("i1", 0, cohort="ml").quota("w", 4)
        .run("i1a", "i1", 4, 0).run("wa", "w", 4, 9).run("wb", "w", 4, 9, started_at=5).wait("t1a", "t1", 4, 5).build(),
        [], [("i1a", "t1a", "reclaim")],
        id="priority and hierarchy combined: reclaim lower_priority spares the far subtree's higher priorities",
    ),
    pytest.param(
        # root: ml(4){research(4){t1 0}, i1 0}, w 4 with a common pool of 0: ml would borrow at the root
        queue(10).cohort("ml", capacity=2).cohort("research", "ml", capacity=4).quota("t1", 0, cohort="research")
        .quota("i1", 0, cohort="ml").quota("w", 4)
        .run("i1a", "i1", 3, 9).run("wa", "w", 5, 0).wait("t1a", "t1", 4, 5).build(),
        [], [("i1a", "t1a", "reclaim")],
        id="no reclaim at a level where the preemptor's side would still borrow",
    ),
    pytest.param(
        # root: ml(4){t1 0}, w 4, common 2: t1a makes ml borrow, so it may only preempt under borrow_within
        queue(10).cohort("ml", capacity=4).quota("t1", 0, cohort="ml", borrow_within=5).quota("w", 4)
        .run("t1r", "t1", 4, 9).run("wa", "w", 4, 9).run("wb", "w", 2, 3).wait("t1a", "t1", 2, 8).build(),
        [], [("wb", "t1a", "borrow_within")],
        id="borrow_within holds across cohorts: a job whose cohort keeps borrowing preempts a low priority",
    ),
    pytest.param(
        queue(10).cohort("ml", capacity=4).quota("t1", 0, cohort="ml").quota("w", 4)
        .run("t1r", "t1", 4, 9).run("wa", "w", 4, 9).run("wb", "w", 2, 3).wait("t1a", "t1", 2, 8).build(),
        [], [],
        id="without borrow_within a job whose cohort keeps borrowing preempts nobody in other subtrees",
    ),
    pytest.param(
        # root: ml(0){t1 4, t2 4}: inside one cohort the flat rules hold, level by level
        queue(8).cohort("ml").quota("t1", 4, cohort="ml").quota("t2", 4, cohort="ml")
        .run("t2a", "t2", 4, 5).run("t2b", "t2", 4, 5, started_at=10).wait("t1a", "t1", 4, 1).build(),
        [], [("t2b", "t1a", "reclaim")],
        id="reclaim between two teams of one cohort",
    ),
]

# Hierarchical reclaim (Kueue's KEP-79, with this project's per-level rule): another quota's job may be
# taken to reclaim at its lowest common cohort with the preemptor when it and the cohorts between are
# borrowing, and the preemptor's side of that cohort can end within its share, counting as freed the
# reclaim candidates inside that side, such as a nominal-0 sibling running on the preemptor's lent GPUs.
HIERARCHICAL_RECLAIM = [
    pytest.param(
        # root: ml(0){t1 4, z 0}: z runs on the 4 GPUs t1 lends
        queue(4).cohort("ml").quota("t1", 4, cohort="ml").quota("z", 0, cohort="ml")
        .run("z1", "z", 2, 5, started_at=1).run("z2", "z", 2, 5, started_at=2).wait("t1a", "t1", 2, 0).build(),
        [], [("z2", "t1a", "reclaim")],
        id="a nominal-0 quota in the preemptor's cohort running on its lent GPUs is a reclaim candidate",
    ),
    pytest.param(
        # root: ml(0){t1 4, z 0}, web(0){w 0}, common 4: z runs on 2 of t1's GPUs, w on the common
        # pool and t1's other 2. Taking w's jobs alone leaves ml borrowing z's 2; with z's job gone ml
        # ends within its share, so t1 reclaims at both levels.
        queue(8).cohort("ml").cohort("web").quota("t1", 4, cohort="ml").quota("z", 0, cohort="ml")
        .quota("w", 0, cohort="web")
        .run("z1", "z", 2, 5).run("w1", "w", 4, 5, started_at=1).run("w2", "w", 2, 5, started_at=2)
        .wait("t1a", "t1", 4, 0).build(),
        [], [("w2", "t1a", "reclaim"), ("z1", "t1a", "reclaim")],
        id="hierarchical reclaim counts the nominal-0 sibling's GPUs as freed: it and a borrower from another cohort are preempted",
    ),
    pytest.param(
        queue(8).cohort("ml").cohort("web").quota("t1", 4, cohort="ml").quota("z", 0, cohort="ml")
        .quota("w", 0, cohort="web")
        .run("z1", "z", 2, 5, preemptible=False).run("w1", "w", 4, 5, started_at=1).run("w2", "w", 2, 5, started_at=2)
        .wait("t1a", "t1", 4, 0).build(),
        [], [],
        id="a sibling that cannot be preempted keeps the cohort borrowing: no reclaim from other cohorts",
    ),
    pytest.param(
        # root: ml(0){research(0){t1 4, z 0}, y 0}, web(0){w 0}, common 4: z runs inside research, y
        # inside ml, both on t1's lent GPUs; each level's borrower brings the level above within its share
        queue(8).cohort("ml").cohort("research", "ml").cohort("web").quota("t1", 4, cohort="research")
        .quota("z", 0, cohort="research").quota("y", 0, cohort="ml").quota("w", 0, cohort="web")
        .run("z1", "z", 1, 5).run("y1", "y", 1, 5).run("w1", "w", 4, 5, started_at=1).run("w2", "w", 2, 5, started_at=2)
        .wait("t1a", "t1", 4, 0).build(),
        [], [("w2", "t1a", "reclaim"), ("y1", "t1a", "reclaim"), ("z1", "t1a", "reclaim")],
        id="hierarchical reclaim through three levels: the farthest borrower first, then each nearer one",
    ),
    pytest.param(
        # root: ml(0){t1 4, z 0}, web(0){w 0}, ops(0){o 0}, common 6: web borrows more than ops, so its
        # jobs go first whatever their priority; ops keeps its lower-priority job
        queue(10).cohort("ml").cohort("web").cohort("ops").quota("t1", 4, cohort="ml").quota("z", 0, cohort="ml")
        .quota("w", 0, cohort="web").quota("o", 0, cohort="ops")
        .run("z1", "z", 2, 5).run("w1", "w", 3, 9, started_at=1).run("w2", "w", 2, 9, started_at=2).run("o1", "o", 3, 0)
        .wait("t1a", "t1", 4, 0).build(),
        [], [("w2", "t1a", "reclaim"), ("z1", "t1a", "reclaim")],
        id="with a nominal-0 sibling freed too, reclaim still takes first from the subtree that borrows most",
    ),
    pytest.param(
        # root: ml(4){t1 4, z 0}, web(0){w 0}, no common pool: z runs on ml's own 4, w on t1's lent 4.
        # Taking w alone lets t1 in with ml within its share: the sibling nearer the quota keeps running.
        queue(8).cohort("ml", capacity=4).cohort("web").quota("t1", 4, cohort="ml").quota("z", 0, cohort="ml")
        .quota("w", 0, cohort="web").run("z1", "z", 4, 0).run("w1", "w", 4, 9).wait("t1a", "t1", 4, 5).build(),
        [], [("w1", "t1a", "reclaim")],
        id="reclaim takes the farther borrower first and spares the nominal-0 sibling when that is enough",
    ),
    pytest.param(
        # root: ml(0){t1 4, z 0}, web(4){w1 4, w2 0}, common 0: w2 borrows w1's idle 4 inside web, which
        # is within its share; z holds t1's 4. Only z's job is reclaimed, web's borrower is never touched.
        queue(12).cohort("ml").cohort("web", capacity=4).quota("t1", 4, cohort="ml").quota("z", 0, cohort="ml")
        .quota("w1", 4, cohort="web").quota("w2", 0, cohort="web")
        .run("z1", "z", 4, 9).run("w2a", "w2", 4, 0).run("w2b", "w2", 4, 0).wait("t1a", "t1", 4, 5).build(),
        [], [("z1", "t1a", "reclaim")],
        id="a subtree within its share never loses jobs, even to a reclaim that also frees a nominal-0 sibling",
    ),
]


@pytest.mark.parametrize(("state", "admit", "preempt"), HIERARCHICAL_RECLAIM)
def test_hierarchical_reclaim(state, admit, preempt):
    check(state, 100.0, admit, preempt)


def test_hierarchical_reclaim_on_one_host_counts_the_nominal_0_sibling_too():
    # The case on one host of 8: the per-host search offers the same candidates.
    state = (
        queue(8).host("h1", 8).cohort("ml").cohort("web").quota("t1", 4, cohort="ml").quota("z", 0, cohort="ml")
        .quota("w", 0, cohort="web")
        .run("z1", "z", 2, 5, host="h1").run("w1", "w", 4, 5, started_at=1, host="h1")
        .run("w2", "w", 2, 5, started_at=2, host="h1").wait("t1a", "t1", 4, 0).build()
    )
    check(state, 100.0, [], [("w2", "t1a", "reclaim"), ("z1", "t1a", "reclaim")])


def test_a_level_counts_what_the_reclaims_beneath_it_free():
    # root: ml(0){research(0){t1 4, z 0}, y 0}, common 4: z holds 1 GPU inside research, y 1 inside ml
    state = (
        queue(8).cohort("ml").cohort("research", "ml").quota("t1", 4, cohort="research")
        .quota("z", 0, cohort="research").quota("y", 0, cohort="ml").run("z1", "z", 1).run("y1", "y", 1).build()
    )
    usage = usage_for(state, {"t1": 0, "z": 1, "y": 1})
    assert usage.ends_within("t1", 4) == [True, False, False]
    assert usage.ends_within("t1", 4, [1, 1, 0]) == [True, True, True]
    # y's GPU is freed at ml only by a reclaim there, which needs research within its share first.
    assert usage.ends_within("t1", 4, [0, 1, 0]) == [True, False, False]
    assert usage.ends_within("t1", 5, [1, 1, 0]) == [False, False, False]


@pytest.mark.parametrize(("state", "admit", "preempt"), RECLAIM)
def test_reclaim(state, admit, preempt):
    check(state, 100.0, admit, preempt)


def test_rejection_counts_the_limits_of_every_cohort_above():
    state = queue(16).cohort("ml", borrow_limit=1).quota("t1", 4, cohort="ml").quota("w", 12).wait("j1", "t1", 6).build()
    (rejection,) = check(state, 100.0, [], []).reject
    assert "quota t1 can never hold more than 5" in rejection.reason and "in cohort ml" in rejection.reason


def test_the_reason_names_the_cohort_that_is_full_and_whom_it_lends_to():
    state = (
        queue(16).cohort("ml", capacity=8).cohort("web", capacity=8)
        .quota("t1", 0, cohort="ml", reclaim="never").quota("w1", 0, cohort="web")
        .run("t1r", "t1", 4, 0).run("w1r", "w1", 12, 90).wait("t1a", "t1", 8, 50).build()
    )
    reason = reason_of(check(state, 100.0, [], []), "t1a")
    assert "cohort ml full: 4/8 GPUs in use by its quotas, 4 lent to web, needs 8" in reason, reason


def test_a_cohorts_own_capacity_is_lent_before_its_teams():
    # root: ml(4){t1 4, t2 4}, w 0: w borrows 6, from ml's own 4 first, then 2 of its idle team's
    state = (
        queue(12).cohort("ml", capacity=4).quota("t1", 4, cohort="ml").quota("t2", 4, cohort="ml").quota("w", 0)
        .run("t1r", "t1", 4).run("wr", "w", 6).build()
    )
    assert {name: usage.lent for name, usage in summarize(state).items()} == {"t1": 0, "t2": 2, "w": 0}
    assert summarize_cohorts(state) == {"ml": CohortUsage(parent=None, capacity=12, in_use=4, borrowed=0, lent=6)}


def test_a_cohort_with_borrowing_teams_sums_them():
    state = (
        queue(16).cohort("ml").cohort("research", "ml", capacity=2).quota("t1", 2, cohort="research").quota("w", 12)
        .run("t1r", "t1", 6).build()
    )
    figures = summarize_cohorts(state)
    assert figures["research"] == CohortUsage(parent="ml", capacity=4, in_use=6, borrowed=2, lent=0)
    assert figures["ml"] == CohortUsage(parent=None, capacity=4, in_use=6, borrowed=2, lent=0)
    assert summarize(state)["w"].lent == 2


def test_a_tree_of_one_cohort_over_everything_decides_as_flat():
    """A single cohort without capacity or limits holding every quota is the flat queue again."""
    flat = (
        queue(12).quota("a", 4).quota("b", 4, sharing="lend").quota("c", 4, reclaim="lower_priority")
        .run("b1", "a", 8, 3).run("c1", "c", 2, 1).wait("p1", "b", 4, 5).wait("p2", "c", 4, 2).wait("p3", "a", 2, 0)
    )
    tree = queue(12).cohort("all")
    tree.quotas = [replace(q, cohort="all") for q in flat.quotas]
    tree.running, tree.pending = flat.running, flat.pending
    assert decide(tree.build(), 100.0).to_dict() == decide(flat.build(), 100.0).to_dict()
