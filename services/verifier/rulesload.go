package verifier

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"go.yaml.in/yaml/v3"

	"github.com/mantle-mesh/mantle/services/verifier/internal/rules"
)

// ErrRulesRejected wraps the compile errors of a rule set that was not made live.
var ErrRulesRejected = errors.New("rule set rejected; the last good set stays live")

// ruleLoader owns the live L2 rule set, which is made of three parts: the rules inline in
// the configuration (fixed for the process), the rules file (re-read on change and on
// ReloadRules), and the draft rules reviewers approved. Any change recompiles the union and
// swaps it in whole; a union that fails to compile leaves the live set as it was.
//
// Why poll the file rather than watch it: polling works the same on every file system
// (network mounts, Kubernetes ConfigMap symlink swaps) and needs no extra dependency; the
// interval (10s by default) is well below how fast operators edit rules.
type ruleLoader struct {
	engine   *rules.Engine
	inline   []rules.Rule
	file     string
	interval time.Duration
	clock    clockwork.Clock
	log      *slog.Logger
	metrics  *metrics

	mu        sync.Mutex // guards everything below and serialises recompiles
	fromFile  []rules.Rule
	approved  []rules.Rule
	fileSum   [sha256.Size]byte // of the file content last accepted or rejected
	rejectErr error             // why the current file content was rejected, if it was

	// onReload, when set (tests), observes every reload the watcher attempts.
	onReload func(*rules.Set, error)
}

func newRuleLoader(cfg Config, clock clockwork.Clock, log *slog.Logger, m *metrics) (*ruleLoader, error) {
	engine, err := rules.NewEngine(cfg.RuleCostLimit)
	if err != nil {
		return nil, err
	}
	l := &ruleLoader{engine: engine, inline: cfg.Rules, file: cfg.RulesFile, interval: cfg.RulesReloadInterval,
		clock: clock, log: log, metrics: m}
	// At start a bad file is an error: there is no last good set to fall back on yet.
	if _, err := l.Reload(); err != nil {
		return nil, err
	}
	return l, nil
}

// readFile parses the rules file strictly.
func (l *ruleLoader) readFile() ([]rules.Rule, [sha256.Size]byte, error) {
	data, err := os.ReadFile(l.file)
	if err != nil {
		return nil, [sha256.Size]byte{}, fmt.Errorf("rules_file: %w", err)
	}
	sum := sha256.Sum256(data)
	var doc struct {
		Rules []rules.Rule `yaml:"rules"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, sum, fmt.Errorf("rules_file %s: %w", l.file, err)
	}
	return doc.Rules, sum, nil
}

// Reload re-reads the rules file and makes inline + file + approved rules live. On error
// nothing changes and the error wraps ErrRulesRejected.
func (l *ruleLoader) Reload() (*rules.Set, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fromFile := l.fromFile
	var sum [sha256.Size]byte
	if l.file != "" {
		var err error
		if fromFile, sum, err = l.readFile(); err != nil {
			l.fileSum, l.rejectErr = sum, err
			l.metrics.reloads.WithLabelValues("rejected").Inc()
			return nil, fmt.Errorf("%w: %w", ErrRulesRejected, err)
		}
	}
	set, err := l.swap(fromFile, l.approved)
	l.fileSum, l.rejectErr = sum, err
	if err != nil {
		return nil, err
	}
	l.fromFile = fromFile
	return set, nil
}

// swap compiles the union and makes it live. l.mu must be held.
func (l *ruleLoader) swap(fromFile, approved []rules.Rule) (*rules.Set, error) {
	all := slices.Concat(l.inline, fromFile, approved)
	set, err := l.engine.Load(all)
	if err != nil {
		l.metrics.reloads.WithLabelValues("rejected").Inc()
		return nil, fmt.Errorf("%w: %w", ErrRulesRejected, err)
	}
	l.metrics.reloads.WithLabelValues("accepted").Inc()
	l.metrics.rules.Set(float64(set.Len()))
	return set, nil
}

// changed reports whether the rules file differs from what was last accepted or rejected.
func (l *ruleLoader) changed() bool {
	data, err := os.ReadFile(l.file)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		return l.rejectErr == nil // a file that disappeared is worth one reload (and one error)
	}
	return sha256.Sum256(data) != l.fileSum
}

// watch polls the rules file until ctx is done.
func (l *ruleLoader) watch(ctx context.Context) {
	if l.file == "" {
		<-ctx.Done()
		return
	}
	t := l.clock.NewTicker(l.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.Chan():
		}
		if !l.changed() {
			continue
		}
		set, err := l.Reload()
		if err != nil {
			l.log.ErrorContext(ctx, "rules file rejected; the last good rule set stays live", "file", l.file, "err", err)
		} else {
			l.log.InfoContext(ctx, "rules reloaded", "file", l.file, "version", set.Version, "rules", set.Len())
		}
		if l.onReload != nil {
			l.onReload(set, err)
		}
	}
}

// Check compiles r on its own (review.RuleSink).
func (l *ruleLoader) Check(r rules.Rule) error {
	_, err := l.engine.Compile([]rules.Rule{r})
	return err
}

// Approve adds an approved draft rule to the live set (review.RuleSink). Approving the same
// rule twice is a no-op.
func (l *ruleLoader) Approve(_ context.Context, r rules.Rule) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.approved {
		if a.ID == r.ID {
			if a.Condition == r.Condition && a.Action == r.Action {
				return nil
			}
			return fmt.Errorf("an approved rule with id %s exists already", r.ID)
		}
	}
	approved := append(slices.Clone(l.approved), r)
	if _, err := l.swap(l.fromFile, approved); err != nil {
		return err
	}
	l.approved = approved
	return nil
}

// setApproved installs the approved rules found in the review store at start.
func (l *ruleLoader) setApproved(approved []rules.Rule) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.swap(l.fromFile, approved); err != nil {
		return err
	}
	l.approved = approved
	return nil
}
