package mesh

import (
	"context"
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"

	eventsv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/events/v1"
	"github.com/mantle-mesh/mantle/pkg/events"
)

// maxLoggedChanges bounds the reload log line: a rewritten file must not make one line of
// megabytes; the event still lists every path.
const maxLoggedChanges = 50

// restartPrefixes are the configuration a reload does not apply (README, "Reloading
// configuration"): the blocks of modules without Reload, and the router settings its
// running budgets, breakers, limiter, store and connections were built from. (The tls
// block's files are read again as they change; the block itself applies at a restart.)
var restartPrefixes = []string{
	"target", "server", "tls", "auth", "events", "tracing", "log", "runtime", "cache", "quota", "verifier",
	"router.retry_budget", "router.hedge_budget", "router.breaker", "router.quota_fallback_rpm",
	"router.idempotency", "router.overload", "router.quota_address", "router.cache_address", "router.verifier_address",
	"router.agent_address", "agent.idempotency",
}

// restartPaths are the changed paths that apply only after a restart.
func restartPaths(changes []configChange) []string {
	var out []string
	for _, c := range changes {
		for _, p := range restartPrefixes {
			if rest, ok := strings.CutPrefix(c.Path, p); ok && (rest == "" || rest[0] == '.' || rest[0] == '[') {
				out = append(out, c.Path)
				break
			}
		}
	}
	return out
}

// reloadAccepted logs and publishes a reload that is now live: which paths changed, from
// what to what (secret-looking values redacted by diffConfig).
func (p *Process) reloadAccepted(ctx context.Context, changes []configChange) {
	paths := make([]string, len(changes))
	lines := make([]string, 0, min(len(changes), maxLoggedChanges))
	for i, c := range changes {
		paths[i] = c.Path
		if i < maxLoggedChanges {
			lines = append(lines, c.String())
		}
	}
	p.Log.InfoContext(ctx, "configuration reloaded", "changed", len(changes), "changes", lines)
	p.publisher.Publish(ctx, events.SubjectConfigReloaded, &eventsv1.ConfigReloadEvent{
		At: timestamppb.New(p.clock.Now()), Targets: p.current.Targets(), ChangedPaths: paths,
		RestartRequired: restartPaths(changes),
	})
}

// reloadRejected logs and publishes a refused reload; the running configuration stays.
func (p *Process) reloadRejected(ctx context.Context, err error) {
	p.Log.ErrorContext(ctx, "configuration not reloaded; the running one is kept", "err", err)
	p.publisher.Publish(ctx, events.SubjectConfigRejected, &eventsv1.ConfigReloadEvent{
		At: timestamppb.New(p.clock.Now()), Targets: p.current.Targets(), Error: err.Error(),
	})
}
