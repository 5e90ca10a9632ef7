"""The issue's example patterns over small streams that have the fields they need (the demo's
streams do not: docs/patterns.md shows the same file)."""

EXAMPLES_YAML = """\
streams:
  logins:
    key_field: user_id
    dimensions: [outcome, ip]
  checkouts:
    key_field: session_id
    dimensions: [stage]
    values: [amount]
  device_events:
    key_field: device_id
    dimensions: [level]
  payments:
    key_field: card_id
    dimensions: [status]
    values: [amount]

patterns:
  - name: credential_stuffing
    description: five failed logins, then a success from the address of the last failure, within ten minutes
    key: user_id
    within: 10m
    steps:
      - {name: failures, stream: logins, where: {outcome: failure}, times: 5}
      - {name: success, stream: logins, where: {outcome: success, ip: {same_as: failures.ip}}}
    measures:
      first_failure: {first_time: failures}
      attempts: {count: failures}

  - name: abandoned_checkout
    description: a checkout started and not completed within 30 minutes
    key: session_id
    steps:
      - {name: started, stream: checkouts, where: {stage: started}}
    not_followed_by: {name: completed, stream: checkouts, where: {stage: completed}, within: 30m}

  - name: error_then_silence
    description: an error on a device, then nothing from it for five minutes
    key: device_id
    steps:
      - {name: error, stream: device_events, where: {level: error}}
    not_followed_by: {name: anything, stream: device_events, within: 5m}

  - name: declined_then_big_approval
    description: three declined payments, then an approved one above 500, within an hour
    key: card_id
    within: 1h
    steps:
      - {name: declined, stream: payments, where: {status: declined}, times: 3}
      - {name: approved, stream: payments, where: {status: approved, amount: {gt: 500}}}
    measures:
      declines: {count: declined}
      approved_amount: {sum: approved.amount}
"""


def brute_force(plan, events, horizon):
    """Every match of `plan` over one key's `events` (sorted in matching order), by the definition
    in docs/patterns.md, written plainly: try every subset of the events with every labelling of
    it by steps (in step order), keep those that satisfy each rule, then apply the skip policy.

    Returns [(decided_at, [(step name, stream, partition, offset, time), ...])] in the order the
    matches are decided. An absence match is decided once an event of the key lies past its
    deadline or the watermark `horizon` (None: never advanced) reached it."""
    from itertools import combinations, combinations_with_replacement

    steps = plan.steps
    candidates = []
    for size in range(1, len(events) + 1):
        for chosen in combinations(range(len(events)), size):
            for labels in combinations_with_replacement(range(len(steps)), size):
                found = _check(plan, events, chosen, labels, horizon)
                if found is not None:
                    candidates.append(found)

    def preference(c):
        decision, chosen, labels = c
        return (decision, events[chosen[0]].order, -len(chosen),
                tuple((events[i].order, label) for i, label in zip(chosen, labels)))

    candidates.sort(key=preference)
    if not plan.no_skip:
        kept, cut = [], -1
        for c in candidates:  # sorted by decision: the first with a start past the cut is next
            if c[1][0] > cut:
                kept.append(c)
                cut = c[1][-1]
        candidates = kept
    return [(decision[0], [(steps[label].name, events[i].stream, events[i].partition, events[i].offset,
                            events[i].time) for i, label in zip(chosen, labels)])
            for decision, chosen, labels in candidates]


def _check(plan, events, chosen, labels, horizon):
    steps = plan.steps
    for s, step in enumerate(steps):  # each step took as many events as its quantifier allows
        count = labels.count(s)
        if count < step.min_times or (step.max_times is not None and count > step.max_times):
            return None
    bindings = {}
    for j, (i, label) in enumerate(zip(chosen, labels)):
        step = steps[label]
        event = events[i]
        if not step.passes(event.stream, event.fields, bindings):
            return None
        if j > 0:
            previous = chosen[j - 1]
            if step.strict and i != previous + 1:  # next: strictly the following event of the key
                return None
            # followed_by: the events skipped in between are ones this step would not have taken
            if any(step.passes(events[m].stream, events[m].fields, bindings) for m in range(previous + 1, i)):
                return None
        bindings[step.name] = dict(event.fields)
    first, last = events[chosen[0]], events[chosen[-1]]
    if plan.within is not None and last.time - first.time > plan.within:
        return None
    if plan.absence is None:
        return ((last.time, 0, chosen[-1]), chosen, labels)
    deadline = last.time + plan.absence_within
    if any(e.time <= deadline and plan.absence.passes(e.stream, e.fields, bindings) for e in events[chosen[-1] + 1:]):
        return None
    decided = (horizon is not None and horizon >= deadline) or any(e.time > deadline for e in events)
    if not decided:
        return None
    return ((deadline, 1, 0), chosen, labels)
