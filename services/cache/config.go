package cache

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"regexp"
	"slices"
	"strconv"
	"time"
)

// Config is the cache block of mantle's YAML file.
//
//	backend: embedded            # or qdrant
//	max_entries: 100000          # embedded only
//	max_bytes: 67108864          # embedded only: 64 MiB of entries
//	embedded: {snapshot_path: /var/lib/mantle/cache.snap, snapshot_interval: 5m}
//	qdrant: {address: qdrant:6334, api_key_env: QDRANT_API_KEY, timeout: 250ms}
//	embedder: {kind: lexical}    # or openai (base_url, model, ...), or none
//	coalesce: {max_wait: 10s, lease_ttl: 30s}
//	default_policy:
//	  cacheable: true
//	  ttl: 1h
//	  max_temperature: 0.3
//	  threshold: 0               # 0: the embedder's calibrated default
//	  max_staleness: 24h
//	scenarios:
//	  support: {ttl: 10m}        # inherits everything else from default_policy
//	  orders:  {cacheable: false}
type Config struct {
	// Backend is where entries live: embedded (in this process; for mantle dev and single
	// nodes) or qdrant (shared by every cache replica).
	Backend string `yaml:"backend"`
	// MaxEntries bounds the embedded index; the least recently used entry is evicted when a
	// new one would exceed it.
	MaxEntries int `yaml:"max_entries"`
	// MaxBytes bounds the embedded index's entries in bytes, about what their text and
	// vectors take of the process's heap (the collector's headroom comes on top, so the
	// process holds about twice this at the default GOGC); the least recently used entries
	// are evicted when a new one would exceed it. Entries count whatever their size toward
	// max_entries, so this is what bounds memory when answers are long.
	MaxBytes int64 `yaml:"max_bytes"`
	// Embedded configures the in-process index of backend embedded.
	Embedded EmbeddedConfig `yaml:"embedded"`
	// Qdrant configures backend qdrant.
	Qdrant QdrantConfig `yaml:"qdrant"`
	// Embedder turns prompts into vectors; what the built-in lexical embedder can and
	// cannot match is in services/cache/README.md.
	Embedder EmbedderConfig `yaml:"embedder"`
	// Coalesce makes identical prompts in flight wait for the first one's answer instead
	// of all calling a model.
	Coalesce CoalesceConfig `yaml:"coalesce"`
	// DefaultPolicy applies to every scenario without its own block, and fills in the
	// keys a scenario block leaves out.
	DefaultPolicy Policy `yaml:"default_policy"`
	// Scenarios overrides the default policy for one scenario, with any default_policy
	// key; keys left out inherit default_policy. A list replaces the default list; []
	// means none.
	Scenarios map[string]ScenarioPolicy `yaml:"scenarios" doc:"leaf"`
}

// Backends.
const (
	BackendEmbedded = "embedded"
	BackendQdrant   = "qdrant"
)

// EmbeddedConfig configures the in-process index.
type EmbeddedConfig struct {
	// SnapshotPath is a file the embedded index is written to periodically and on
	// shutdown, and read back at start, so that a restart keeps the cache. Empty: no
	// snapshot. The file holds tenants' prompts and answers; it is written with mode 0600.
	SnapshotPath string `yaml:"snapshot_path"`
	// SnapshotInterval is how often the snapshot is written while running.
	SnapshotInterval time.Duration `yaml:"snapshot_interval"`
	// SnapshotMaxBytes bounds the snapshot file. A larger file, or one whose records are
	// damaged or claim more than they hold, is not read: the cache starts empty with a
	// warning and mantle_cache_snapshot_loads_total{result="refused"}. When writing, the
	// least recently used entries that would go past it are left out.
	SnapshotMaxBytes int64 `yaml:"snapshot_max_bytes"`
}

// Client certificates the Qdrant client may present (QdrantConfig.ClientCertificate).
const (
	QdrantClientCertificateNone = "none"
	QdrantClientCertificateMesh = "mesh"
)

// QdrantConfig configures the Qdrant backend (server v1.17.x, gRPC API).
type QdrantConfig struct {
	// Address is host:port of Qdrant's gRPC API (port 6334 by default), server v1.17.x.
	Address string `yaml:"address"`
	// APIKeyEnv names the environment variable holding the API key; empty for none.
	APIKeyEnv string `yaml:"api_key_env"`
	// TLS connects with TLS (required by Qdrant Cloud); Qdrant's certificate is verified
	// against ca_file, or the system's roots.
	TLS bool `yaml:"tls"`
	// CAFile is the CA bundle (PEM) that verifies Qdrant's certificate, for a Qdrant with a
	// CA of its own; read again when it changes. Empty: the system's roots. Needs tls.
	CAFile string `yaml:"ca_file,omitempty"`
	// ClientCertificate is what the client presents when Qdrant asks for a certificate:
	// none (the default) or mesh, this process's certificate from the tls block, read at
	// each handshake so that a rotated certificate is used without a restart. Needs tls
	// (and, for mesh, the tls block).
	ClientCertificate string `yaml:"client_certificate,omitempty"`
	// CollectionPrefix starts the name of every collection; the embedder namespace ends it
	// (mantle_cache_lexical-v1).
	CollectionPrefix string `yaml:"collection_prefix"`
	// Timeout bounds every call. A lookup whose call fails or times out is a miss: a slow
	// cache must not make requests slower than no cache.
	Timeout time.Duration `yaml:"timeout"`
	// SweepInterval is how often expired points are deleted.
	SweepInterval time.Duration `yaml:"sweep_interval"`
}

// EmbedderConfig selects the embedder.
type EmbedderConfig struct {
	// Kind is lexical (built in, offline), openai (any OpenAI-compatible /v1/embeddings
	// endpoint) or none (exact matches only; backend embedded only).
	Kind string `yaml:"kind"`
	// Timeout bounds one embedding by an embedder that waits on a network (openai); the
	// lexical embedder computes in place and needs none. On failure the lookup still tries
	// the exact match.
	Timeout time.Duration `yaml:"timeout"`
	// BaseURL is, for kind openai, the endpoint (required). A redirect is not followed:
	// the lookup fails over to the exact match, and the error names where it pointed.
	BaseURL string `yaml:"base_url"`
	// Model is, for kind openai, the embedding model (required).
	Model string `yaml:"model"`
	// Dimensions asks an openai model for shorter vectors; 0 keeps its own size.
	Dimensions int `yaml:"dimensions"`
	// APIKeyEnv names, for kind openai, the environment variable holding the API key.
	APIKeyEnv string `yaml:"api_key_env"`
	// Version is appended to the embedder namespace; change it when the model behind the
	// name changes (a new namespace starts a cold cache).
	Version string `yaml:"version"`
}

// Embedder kinds.
const (
	EmbedderLexical = "lexical"
	EmbedderOpenAI  = "openai"
	EmbedderNone    = "none"
)

// CoalesceConfig bounds request coalescing.
type CoalesceConfig struct {
	// MaxWait is the longest an identical prompt waits for the first one's answer.
	MaxWait time.Duration `yaml:"max_wait"`
	// LeaseTTL is how long a coalescing lease holds when the request carries no deadline;
	// a lease never outlives its request's deadline.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
}

// Policy decides which answers may be stored, for how long, and how close a question must be
// to use one.
type Policy struct {
	// Cacheable false turns the cache off for the scenario: nothing is stored or looked up.
	Cacheable bool `yaml:"cacheable"`
	// TTL is how long a stored answer is served. A Store request may ask for less, never
	// more. Reads do not renew it.
	TTL time.Duration `yaml:"ttl"`
	// MaxTemperature is the highest sampling temperature whose answers are stored: above it
	// an answer is one random draw among many, not the answer to the question. A request
	// without temperature counts as the provider default (usually 1.0), so send
	// "temperature": 0 for cacheable requests.
	MaxTemperature float64 `yaml:"max_temperature"`
	// VolatileMarkers are words that make a prompt time-dependent wherever they stand:
	// English and Chinese time and live-data words (today, now, latest, 库存, 实时 ...). A
	// prompt whose user turns contain one is never stored or served. Matching happens after
	// the same normalisation as the key; Latin-script markers match whole words only, so
	// "now" does not match "know". Questions whose shape makes them volatile are
	// detect_volatile's.
	VolatileMarkers []string `yaml:"volatile_markers"`
	// PersonalMarkers are English and Chinese disclosures that make a prompt about one
	// person wherever they stand (my phone number, 我的地址是 ...); matched like volatile
	// markers. Questions about one's own records are detect_personal's.
	PersonalMarkers []string `yaml:"personal_markers"`
	// PersonalPatterns are regular expressions (RE2) for user-specific identifiers: e-mail
	// addresses, phone numbers, long account or order numbers.
	PersonalPatterns []string `yaml:"personal_patterns"`
	// DetectVolatile turns on the built-in detection of volatile questions in English and
	// Chinese (the time, the date, weather, market prices and exchange rates, scores, events
	// this week, the status of a service or an order), which reads the question's shape
	// where markers only see words: "what time is it", not "what time do you open".
	DetectVolatile bool `yaml:"detect_volatile"`
	// DetectPersonal turns on the built-in detection of questions about the asker's own
	// records (my balance, did my payment go through, 我还有多少积分); how-to and policy
	// questions that merely say "my" (can I change my delivery address?) are not personal.
	// A personal answer is cached only for the end user who asked (the request's user
	// field), never across users, and not at all without one.
	DetectPersonal bool `yaml:"detect_personal"`
	// RefusalMarkers are English and Chinese openings of an answer that declines ("I'm
	// sorry, but I can't", 抱歉，我无法); such answers are never stored, even when the
	// verifier let them pass.
	RefusalMarkers []string `yaml:"refusal_markers"`
	// Threshold is the cosine similarity a fresh entry needs to answer. 0 takes the
	// embedder's calibrated default: 0.94 for the lexical embedder, 0.92 for a dense one.
	// The thresholds must satisfy approximate_threshold <= threshold <= stale_threshold,
	// each 0 or within [0.85, 1]; a scenario that sets only threshold keeps the default
	// distances to the other two.
	Threshold float64 `yaml:"threshold"`
	// StaleThreshold is what an entry past its TTL needs in cache-only and approximate
	// lookups: staleness is a second doubt, so the similarity must be higher. 0: the
	// embedder's default, 0.97 (lexical) or 0.95 (dense).
	StaleThreshold float64 `yaml:"stale_threshold"`
	// ApproximateThreshold is the floor of the degradation ladder's L2 related answers;
	// never below 0.85. 0: the embedder's default, 0.90 (lexical) or 0.85 (dense).
	ApproximateThreshold float64 `yaml:"approximate_threshold"`
	// MaxStaleness is how long past its TTL a verified entry may still answer in cache-only
	// and approximate lookups. 0: never.
	MaxStaleness time.Duration `yaml:"max_staleness"`
}

// ScenarioPolicy overrides some keys of the default policy for one scenario; a key left
// out (nil) inherits the default. A list replaces the default list when present; write []
// for none.
type ScenarioPolicy struct {
	Cacheable            *bool          `yaml:"cacheable,omitempty"`
	TTL                  *time.Duration `yaml:"ttl,omitempty"`
	MaxTemperature       *float64       `yaml:"max_temperature,omitempty"`
	VolatileMarkers      []string       `yaml:"volatile_markers,omitempty"`
	PersonalMarkers      []string       `yaml:"personal_markers,omitempty"`
	PersonalPatterns     []string       `yaml:"personal_patterns,omitempty"`
	DetectVolatile       *bool          `yaml:"detect_volatile,omitempty"`
	DetectPersonal       *bool          `yaml:"detect_personal,omitempty"`
	RefusalMarkers       []string       `yaml:"refusal_markers,omitempty"`
	Threshold            *float64       `yaml:"threshold,omitempty"`
	StaleThreshold       *float64       `yaml:"stale_threshold,omitempty"`
	ApproximateThreshold *float64       `yaml:"approximate_threshold,omitempty"`
	MaxStaleness         *time.Duration `yaml:"max_staleness,omitempty"`
}

// approximateFloor is the lowest similarity at which any answer is served (DESIGN.md:
// approximate answers never below 0.85).
const approximateFloor = 0.85

// thresholds are the three similarity thresholds of a scenario.
type thresholds struct {
	normal, stale, approximate float64
}

// defaultThresholds are the calibrated defaults per embedder kind. Dense embedders use the
// 0.92 that semantic caches commonly start from. The lexical embedder's scores measure shared
// wording; on the labelled evaluation set (testdata/eval.jsonl, eval_test.go) its first
// false hit appears below 0.90 (金卡/白金卡 at 0.899) while recall barely changes between
// 0.90 and 0.96, so its threshold is 0.94: stricter than the dense default, with a margin
// for questions the set does not have. Its approximate floor sits at the last
// threshold without a false hit on the set.
func defaultThresholds(kind string) thresholds {
	if kind == EmbedderLexical {
		return thresholds{normal: 0.94, stale: 0.97, approximate: 0.90}
	}
	return thresholds{normal: 0.92, stale: 0.95, approximate: approximateFloor}
}

// defaultVolatileMarkers are the default volatile markers: time words and live data, in
// English and Chinese. Questions with a sentence shape (what time is it, where is my order)
// are the built-in detection's (detect_volatile); a marker is a word that is volatile
// wherever it stands.
var defaultVolatileMarkers = []string{
	"today", "tonight", "tomorrow", "yesterday", "now", "current", "currently", "latest",
	"real-time", "realtime", "live", "weather", "in stock", "inventory", "order status",
	"今天", "今日", "明天", "昨天", "现在", "目前", "当前", "最新", "实时", "天气", "库存", "股价",
}

// defaultPersonalMarkers are disclosures, personal wherever they stand. Questions about
// one's records (my balance, 我的积分) are the built-in detection's (detect_personal), which
// tells them from how-to questions that merely say "my" (how do I delete my account?).
var defaultPersonalMarkers = []string{
	"my account number", "my address is", "my phone number", "my email is", "my card number",
	"我的地址是", "我的手机号", "我的邮箱是", "我的卡号", "我的身份证",
}

// defaultPersonalPatterns match identifiers of one person: e-mail addresses, phone
// numbers (international, North American), and runs of ten or more digits (Chinese mobile
// numbers, account, order, card and ID numbers). Dates (2024-01-01) match none of them.
var defaultPersonalPatterns = []string{
	`[\w.+-]+@[\w-]+(\.[\w-]+)+`,
	`\+\d[\d -]{7,}\d`,
	`\b\d{3}[ -]\d{3,4}[ -]\d{4}\b`,
	`\d{10,}`,
}

// defaultRefusalMarkers are openings of answers that decline to answer.
var defaultRefusalMarkers = []string{
	"i'm sorry, but i can't", "i am sorry, but i cannot", "i cannot help with", "i can't help with",
	"i'm unable to", "i am unable to", "as an ai language model",
	"抱歉，我无法", "很抱歉，我不能", "抱歉，我不能", "我无法回答", "作为一个人工智能", "作为ai语言模型",
}

// DefaultConfig returns the configuration used when the file leaves the cache block out.
func DefaultConfig() Config {
	return Config{
		Backend:    BackendEmbedded,
		MaxEntries: 100_000,
		MaxBytes:   64 << 20,
		Embedded:   EmbeddedConfig{SnapshotInterval: 5 * time.Minute, SnapshotMaxBytes: DefaultSnapshotMaxBytes},
		Qdrant: QdrantConfig{
			CollectionPrefix: "mantle_cache_",
			Timeout:          250 * time.Millisecond,
			SweepInterval:    time.Minute,
		},
		Embedder: EmbedderConfig{Kind: EmbedderLexical, Timeout: 500 * time.Millisecond},
		Coalesce: CoalesceConfig{MaxWait: 10 * time.Second, LeaseTTL: 30 * time.Second},
		DefaultPolicy: Policy{
			Cacheable:        true,
			TTL:              time.Hour,
			MaxTemperature:   0.3,
			VolatileMarkers:  slices.Clone(defaultVolatileMarkers),
			PersonalMarkers:  slices.Clone(defaultPersonalMarkers),
			PersonalPatterns: slices.Clone(defaultPersonalPatterns),
			RefusalMarkers:   slices.Clone(defaultRefusalMarkers),
			DetectVolatile:   true,
			DetectPersonal:   true,
			MaxStaleness:     24 * time.Hour,
		},
	}
}

// Validate reports every invalid key, named relative to the cache block.
func (c Config) Validate() error {
	var errs []error
	switch c.Backend {
	case BackendEmbedded:
		if c.MaxEntries <= 0 {
			errs = append(errs, fmt.Errorf("max_entries: must be positive, got %d", c.MaxEntries))
		}
		if c.MaxBytes < 1<<20 {
			errs = append(errs, fmt.Errorf("max_bytes: must be at least 1 MiB, got %d", c.MaxBytes))
		}
		if c.Embedded.SnapshotPath != "" && c.Embedded.SnapshotInterval <= 0 {
			errs = append(errs, fmt.Errorf("embedded.snapshot_interval: must be positive with a snapshot_path, got %s", c.Embedded.SnapshotInterval))
		}
		if c.Embedded.SnapshotPath != "" && c.Embedded.SnapshotMaxBytes < 1<<20 {
			errs = append(errs, fmt.Errorf("embedded.snapshot_max_bytes: must be at least 1 MiB with a snapshot_path, got %d", c.Embedded.SnapshotMaxBytes))
		}
	case BackendQdrant:
		if _, port, err := net.SplitHostPort(c.Qdrant.Address); err != nil {
			errs = append(errs, fmt.Errorf("qdrant.address: must be host:port, got %q", c.Qdrant.Address))
		} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			errs = append(errs, fmt.Errorf("qdrant.address: port must be a number, got %q", port))
		}
		if c.Qdrant.Timeout <= 0 {
			errs = append(errs, fmt.Errorf("qdrant.timeout: must be positive, got %s", c.Qdrant.Timeout))
		}
		if c.Qdrant.SweepInterval <= 0 {
			errs = append(errs, fmt.Errorf("qdrant.sweep_interval: must be positive, got %s", c.Qdrant.SweepInterval))
		}
		if c.Qdrant.CollectionPrefix == "" {
			errs = append(errs, errors.New("qdrant.collection_prefix: required"))
		}
		if c.Embedder.Kind == EmbedderNone {
			errs = append(errs, errors.New("embedder.kind: none needs backend embedded; Qdrant stores vectors"))
		}
		switch c.Qdrant.ClientCertificate {
		case "", QdrantClientCertificateNone, QdrantClientCertificateMesh:
		default:
			errs = append(errs, fmt.Errorf("qdrant.client_certificate: must be none or mesh, got %q", c.Qdrant.ClientCertificate))
		}
		if !c.Qdrant.TLS && (c.Qdrant.CAFile != "" || c.Qdrant.ClientCertificate == QdrantClientCertificateMesh) {
			errs = append(errs, errors.New("qdrant: ca_file and client_certificate need tls: true"))
		}
	default:
		errs = append(errs, fmt.Errorf("backend: must be embedded or qdrant, got %q", c.Backend))
	}
	switch c.Embedder.Kind {
	case EmbedderLexical, EmbedderNone:
	case EmbedderOpenAI:
		if c.Embedder.BaseURL == "" {
			errs = append(errs, errors.New("embedder.base_url: required for kind openai"))
		}
		if c.Embedder.Model == "" {
			errs = append(errs, errors.New("embedder.model: required for kind openai"))
		}
		if c.Embedder.Dimensions < 0 {
			errs = append(errs, fmt.Errorf("embedder.dimensions: must not be negative, got %d", c.Embedder.Dimensions))
		}
	default:
		errs = append(errs, fmt.Errorf("embedder.kind: must be lexical, openai or none, got %q", c.Embedder.Kind))
	}
	if c.Embedder.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("embedder.timeout: must be positive, got %s", c.Embedder.Timeout))
	}
	if c.Coalesce.MaxWait < 0 {
		errs = append(errs, fmt.Errorf("coalesce.max_wait: must not be negative, got %s", c.Coalesce.MaxWait))
	}
	if c.Coalesce.LeaseTTL <= 0 {
		errs = append(errs, fmt.Errorf("coalesce.lease_ttl: must be positive, got %s", c.Coalesce.LeaseTTL))
	}
	defaults := defaultThresholds(c.Embedder.Kind)
	errs = append(errs, c.DefaultPolicy.validate("default_policy", defaults)...)
	for _, name := range slices.Sorted(maps.Keys(c.Scenarios)) {
		resolved := c.DefaultPolicy.with(c.Scenarios[name])
		errs = append(errs, resolved.validate("scenarios."+name, defaults)...)
	}
	return errors.Join(errs...)
}

func (p Policy) validate(prefix string, defaults thresholds) []error {
	var errs []error
	if p.TTL <= 0 {
		errs = append(errs, fmt.Errorf("%s.ttl: must be positive, got %s", prefix, p.TTL))
	}
	if p.MaxTemperature < 0 || math.IsNaN(p.MaxTemperature) || math.IsInf(p.MaxTemperature, 0) {
		errs = append(errs, fmt.Errorf("%s.max_temperature: must be a non-negative number, got %v", prefix, p.MaxTemperature))
	}
	if p.MaxStaleness < 0 {
		errs = append(errs, fmt.Errorf("%s.max_staleness: must not be negative, got %s", prefix, p.MaxStaleness))
	}
	for _, list := range []struct {
		key     string
		markers []string
	}{{"volatile_markers", p.VolatileMarkers}, {"personal_markers", p.PersonalMarkers}, {"refusal_markers", p.RefusalMarkers}} {
		for i, m := range list.markers {
			if normalizeText(m) == "" {
				errs = append(errs, fmt.Errorf("%s.%s[%d]: must contain a word, got %q", prefix, list.key, i, m))
			}
		}
	}
	for i, pattern := range p.PersonalPatterns {
		if _, err := regexp.Compile(pattern); err != nil {
			errs = append(errs, fmt.Errorf("%s.personal_patterns[%d]: %w", prefix, i, err))
		}
	}
	for _, th := range []struct {
		key   string
		value float64
	}{{"threshold", p.Threshold}, {"stale_threshold", p.StaleThreshold}, {"approximate_threshold", p.ApproximateThreshold}} {
		if th.value != 0 && !(th.value >= approximateFloor && th.value <= 1) {
			errs = append(errs, fmt.Errorf("%s.%s: must be 0 (the embedder's default) or within [%.2f, 1], got %v", prefix, th.key, approximateFloor, th.value))
		}
	}
	if len(errs) == 0 {
		t := p.thresholds(defaults)
		if !(t.approximate <= t.normal && t.normal <= t.stale) {
			errs = append(errs, fmt.Errorf("%s: thresholds must satisfy approximate_threshold (%v) <= threshold (%v) <= stale_threshold (%v)", prefix, t.approximate, t.normal, t.stale))
		}
	}
	return errs
}

// thresholds resolves the policy's thresholds against the embedder's defaults.
func (p Policy) thresholds(defaults thresholds) thresholds {
	t := defaults
	if p.Threshold != 0 {
		t.normal = p.Threshold
		// A scenario that only sets its threshold keeps the default distances to the
		// other two, within [floor, 1].
		t.stale = roundThreshold(min(1, max(p.Threshold+defaults.stale-defaults.normal, p.Threshold)))
		t.approximate = roundThreshold(max(approximateFloor, min(p.Threshold-(defaults.normal-defaults.approximate), p.Threshold)))
	}
	if p.StaleThreshold != 0 {
		t.stale = p.StaleThreshold
	}
	if p.ApproximateThreshold != 0 {
		t.approximate = p.ApproximateThreshold
	}
	return t
}

// roundThreshold drops float noise from derived thresholds (0.93 + 0.03 is 0.9599999...).
func roundThreshold(x float64) float64 { return math.Round(x*1e4) / 1e4 }

// with returns p with the keys that o sets replaced.
func (p Policy) with(o ScenarioPolicy) Policy {
	if o.Cacheable != nil {
		p.Cacheable = *o.Cacheable
	}
	if o.TTL != nil {
		p.TTL = *o.TTL
	}
	if o.MaxTemperature != nil {
		p.MaxTemperature = *o.MaxTemperature
	}
	if o.VolatileMarkers != nil {
		p.VolatileMarkers = o.VolatileMarkers
	}
	if o.PersonalMarkers != nil {
		p.PersonalMarkers = o.PersonalMarkers
	}
	if o.PersonalPatterns != nil {
		p.PersonalPatterns = o.PersonalPatterns
	}
	if o.RefusalMarkers != nil {
		p.RefusalMarkers = o.RefusalMarkers
	}
	if o.DetectVolatile != nil {
		p.DetectVolatile = *o.DetectVolatile
	}
	if o.DetectPersonal != nil {
		p.DetectPersonal = *o.DetectPersonal
	}
	if o.Threshold != nil {
		p.Threshold = *o.Threshold
	}
	if o.StaleThreshold != nil {
		p.StaleThreshold = *o.StaleThreshold
	}
	if o.ApproximateThreshold != nil {
		p.ApproximateThreshold = *o.ApproximateThreshold
	}
	if o.MaxStaleness != nil {
		p.MaxStaleness = *o.MaxStaleness
	}
	return p
}
