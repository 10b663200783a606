package cache

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/pkg/procusage"
	"github.com/mantle-mesh/mantle/services/cache/internal/embed"
)

// The benchmarks fill the embedded index with a synthetic corpus, then time whole
// Service.Lookup calls: normalisation, keys, policy, exact get, lexical embedding,
// similarity search and the near-miss check. Two corpora: support questions in English and
// Chinese, built from templates and slot fillers so that questions share words the way
// real ones do (many mention "reset" or 手机; few mention one model number), and numbered
// prompts that differ only in a number, which is what `mantle bench-load` sends and the
// worst case for the index (indexCorpus).
//
//	go test -run '^$' -bench 'Lookup|Memory' -benchtime 3000x ./services/cache/
//	MANTLE_BENCH_CACHE_ENTRIES=1000000 go test -run '^$' -bench 'Lookup/' -benchtime 2000x -timeout 3h ./services/cache/
//
// The partitions are built at run time, of the sizes MANTLE_BENCH_CACHE_ENTRIES lists
// (benchSizes). Each benchmark reports p50-ns and p99-ns (per lookup) next to ns/op.

var (
	benchBrands     = strings.Fields("Acme Zenith Nova Orbit Pixel Quanta Helix Vertex Aurora Lumen Cobalt Ember Falcon Glacier Harbor Ion Juniper Krypton Lattice Meridian Nimbus Onyx Prism Quasar Raven Sierra Tundra Umbra Vector Willow Xenon Yonder Zephyr Atlas Boreal Cinder Delta Echo Fjord Garnet")
	benchCategories = strings.Fields("router laptop headphones speaker camera printer monitor keyboard mouse tablet phone watch charger drone projector scanner vacuum kettle blender thermostat doorbell lock microwave fridge heater fan purifier scale treadmill")
	benchVerbs      = strings.Fields("reset return cancel update install configure connect clean replace register activate upgrade repair charge pair export")
	benchSymptoms   = []string{"not charging", "overheating", "making noise", "not turning on", "disconnecting", "running slow", "showing an error", "not pairing"}
	benchAttrs      = []string{"battery life", "warranty period", "weight", "price", "power usage", "screen size", "range", "capacity"}
	zhBrands        = strings.Fields("华为 小米 联想 海尔 格力 美的 大疆 罗技 索尼 佳能 飞利浦 松下 戴尔 惠普 苹果 三星 荣耀 一加 魅族 创维")
	zhCategories    = strings.Fields("手机 路由器 耳机 音箱 相机 打印机 显示器 键盘 鼠标 平板 手表 充电器 无人机 投影仪 扫地机 电水壶 空调 冰箱 洗衣机 电视")
	zhVerbs         = strings.Fields("退货 重置 保修 激活 升级 维修 清洗 安装 连接 换货 注册 配对")
	zhSymptoms      = []string{"充不进电", "发烫", "有杂音", "开不了机", "老是断线", "很卡", "报错", "连不上"}
	zhAttrs         = []string{"续航", "保修期", "重量", "价格", "功率", "尺寸", "容量"}
)

func pick[T any](r *rand.Rand, xs []T) T { return xs[r.IntN(len(xs))] }

// benchQuestion draws one question.
func benchQuestion(r *rand.Rand) string {
	product := pick(r, benchBrands) + " " + pick(r, benchCategories)
	zhProduct := pick(r, zhBrands) + pick(r, zhCategories)
	model := fmt.Sprintf("%c%d", 'A'+rune(r.IntN(26)), 10+r.IntN(990))
	switch r.IntN(8) {
	case 0:
		return fmt.Sprintf("How do I %s my %s %s?", pick(r, benchVerbs), product, model)
	case 1:
		return fmt.Sprintf("Why is my %s %s %s?", product, model, pick(r, benchSymptoms))
	case 2:
		return fmt.Sprintf("What is the %s of the %s %s?", pick(r, benchAttrs), product, model)
	case 3:
		return fmt.Sprintf("Can I %s the %s %s after %d days?", pick(r, benchVerbs), product, model, 1+r.IntN(90))
	case 4:
		return fmt.Sprintf("%s %s怎么%s", zhProduct, model, pick(r, zhVerbs))
	case 5:
		return fmt.Sprintf("%s %s%s怎么办", zhProduct, model, pick(r, zhSymptoms))
	case 6:
		return fmt.Sprintf("%s %s的%s是多少", zhProduct, model, pick(r, zhAttrs))
	default:
		return fmt.Sprintf("%s %s买了%d天还能%s吗", zhProduct, model, 1+r.IntN(90), pick(r, zhVerbs))
	}
}

// benchAnswer is an answer of a typical length (about 400 bytes).
var benchAnswer = strings.Repeat("Open Settings, choose the device, select Reset and confirm; the device restarts. ", 5)

// benchSizes returns the partition sizes the benchmarks build: MANTLE_BENCH_CACHE_ENTRIES,
// a comma-separated list, or 10000 (a few seconds; a million entries take tens of minutes
// and gigabytes of memory to build).
func benchSizes(b *testing.B) []int {
	list := os.Getenv("MANTLE_BENCH_CACHE_ENTRIES")
	if list == "" {
		return []int{10_000}
	}
	var sizes []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			b.Fatalf("MANTLE_BENCH_CACHE_ENTRIES=%q: want a comma-separated list of positive counts", list)
		}
		sizes = append(sizes, n)
	}
	return sizes
}

type benchCache struct {
	f         fixture
	questions []string
	prompts   []Prompt
}

// newBenchCache stores n support questions; see newCorpusCache.
func newBenchCache(b *testing.B, n, partitions int, keep bool) benchCache {
	return newCorpusCache(b, "support", n, partitions, keep)
}

// newCorpusCache stores n questions of corpus (indexCorpus). partitions spreads them over
// that many scopes (by system prompt); 1 puts all of them in one, the worst case for the
// search. keep keeps the prompts for lookups (the memory benchmark leaves them out of its
// measurement). The index links vectors into its graphs as Put stores them, as it does
// without its linker.
func newCorpusCache(b *testing.B, corpus string, n, partitions int, keep bool) benchCache {
	cfg := DefaultConfig()
	cfg.MaxEntries, cfg.MaxBytes = n, 1<<40 // every entry stays: the benchmarks measure n of them
	cfg.DefaultPolicy.VolatileMarkers, cfg.DefaultPolicy.PersonalMarkers, cfg.DefaultPolicy.PersonalPatterns = []string{}, []string{}, []string{}
	cfg.DefaultPolicy.TTL = 24 * time.Hour
	f := newFixture(b, cfg)
	bc := benchCache{f: f}
	for stored, q := range indexCorpus(corpus, n) {
		p := basePrompt(q)
		p.Messages[0].Content = fmt.Sprintf("You are the support agent of shop %d.", stored%partitions)
		req := answer(p)
		req.Content = fmt.Sprintf("%s(%d)", benchAnswer, stored) // an answer of its own, as in life
		if res, err := f.svc.Store(context.Background(), "acme", req); err != nil || !res.Stored {
			b.Fatalf("Store = (%+v, %v)", res, err)
		}
		if keep {
			bc.questions = append(bc.questions, q)
			bc.prompts = append(bc.prompts, p)
		}
	}
	return bc
}

// runLookups times lookups of the prompts next returns and reports their percentiles: of
// wall time (p50-ns, p99-ns) and, on Linux, of the CPU time of the lookup's thread
// (cpu-p50-ns, cpu-p99-ns), which leaves out the time spent waiting for a CPU.
func runLookups(b *testing.B, f fixture, next func(i int) Prompt, wantHit bool) {
	ctx := context.Background()
	wall := make([]time.Duration, 0, 1<<16)
	cpu := make([]time.Duration, 0, 1<<16)
	hits := 0
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	runtime.GC() // start from a settled heap, not in the middle of collecting the build's garbage
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		p := next(i)
		cpuStart, cpuOK := procusage.ThreadCPU()
		start := time.Now()
		res, err := f.svc.Lookup(ctx, "acme", LookupRequest{Prompt: p})
		wall = append(wall, time.Since(start))
		if cpuEnd, ok := procusage.ThreadCPU(); ok && cpuOK {
			cpu = append(cpu, cpuEnd-cpuStart)
		}
		if err != nil {
			b.Fatalf("Lookup: %v", err)
		}
		if res.Hit {
			hits++
		}
		i++
	}
	b.StopTimer()
	reportPercentiles(b, wall, cpu)
	b.ReportMetric(float64(hits)/float64(len(wall)), "hit-ratio")
	if wantHit && hits == 0 {
		b.Errorf("no lookup hit; the benchmark is not measuring hits")
	}
}

// reportPercentiles reports the median and 99th percentile of wall and CPU times.
func reportPercentiles(b *testing.B, wall, cpu []time.Duration) {
	for _, m := range []struct {
		name string
		d    []time.Duration
	}{{"", wall}, {"cpu-", cpu}} {
		if len(m.d) == 0 {
			continue
		}
		slices.Sort(m.d)
		b.ReportMetric(float64(m.d[len(m.d)/2].Nanoseconds()), m.name+"p50-ns")
		b.ReportMetric(float64(m.d[len(m.d)*99/100].Nanoseconds()), m.name+"p99-ns")
	}
}

func BenchmarkLookup(b *testing.B) {
	for _, n := range benchSizes(b) {
		for _, corpus := range []string{"support", "numbered"} {
			partitions := []int{1, 100}
			if n > 100_000 {
				partitions = []int{1} // the worst case only: building takes long enough
			}
			for _, parts := range partitions {
				b.Run(fmt.Sprintf("entries=%d/corpus=%s/partitions=%d", n, corpus, parts), func(b *testing.B) {
					benchLookups(b, newCorpusCache(b, corpus, n, parts, true), corpus)
				})
			}
		}
	}
}

// benchLookups times the three kinds of lookup on a built cache.
func benchLookups(b *testing.B, bc benchCache, corpus string) {
	r := rand.New(rand.NewPCG(3, 4))
	// Exact: a stored question in another spelling.
	b.Run("exact", func(b *testing.B) {
		runLookups(b, bc.f, func(int) Prompt {
			p := bc.prompts[r.IntN(len(bc.prompts))]
			p.Messages = []Message{p.Messages[0], {Role: roleUser, Content: strings.ToUpper(p.Messages[1].Content)}}
			return p
		}, true)
	})
	// Semantic: a stored question reworded, found by similarity.
	b.Run("semantic", func(b *testing.B) {
		runLookups(b, bc.f, func(int) Prompt {
			p := bc.prompts[r.IntN(len(bc.prompts))]
			return reworded(p)
		}, true)
	})
	// Miss: a new question; nothing stored is close enough.
	b.Run("miss", func(b *testing.B) {
		qr := rand.New(rand.NewPCG(5, 6))
		runLookups(b, bc.f, func(i int) Prompt {
			p := bc.prompts[i%len(bc.prompts)]
			q := benchQuestion(qr) + " today"
			if corpus == "numbered" {
				q = numberedQuestion(len(bc.prompts) + qr.IntN(len(bc.prompts)))
			}
			p.Messages = []Message{p.Messages[0], {Role: roleUser, Content: q}}
			return p
		}, false)
	})
}

// reworded asks p's question in other words: 请问 before a Chinese question, "please" after
// an English one. The exact key differs; the similarity stays above the threshold.
func reworded(p Prompt) Prompt {
	q := p.Messages[1].Content
	if strings.ContainsFunc(q, isHanRune) {
		q = "请问" + q
	} else {
		q = strings.ToLower(strings.TrimSuffix(q, "?")) + " please"
	}
	p.Messages = []Message{p.Messages[0], {Role: roleUser, Content: q}}
	return p
}

func isHanRune(r rune) bool { return r >= 0x4e00 && r <= 0x9fff }

// BenchmarkLookupParallel runs lookups from all CPUs at once on the 100k-entry cache in one
// partition (searches share a read lock; stores would wait).
func BenchmarkLookupParallel(b *testing.B) {
	bc := newBenchCache(b, 100_000, 1, true)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(rand.Uint64(), 7))
		for pb.Next() {
			p := reworded(bc.prompts[r.IntN(len(bc.prompts))])
			if _, err := bc.f.svc.Lookup(context.Background(), "acme", LookupRequest{Prompt: p}); err != nil {
				b.Fatalf("Lookup: %v", err)
			}
		}
	})
}

// BenchmarkEmbeddedIndexMemory reports the heap an entry costs: its answer (about 410
// bytes here), question, keys, vector, postings and bookkeeping; and what max_bytes counts
// of it (entrySize).
func BenchmarkEmbeddedIndexMemory(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("entries=%d", n), func(b *testing.B) {
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				gcBase := gcTime()
				runtime.ReadMemStats(&before)
				bc := newBenchCache(b, n, 1, false)
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(n), "heap-bytes/entry")
				// Objects are what the collector marks one by one: its cost per collection
				// grows with them (and with the pointers in them), not with bytes alone.
				b.ReportMetric(float64(after.HeapObjects-before.HeapObjects)/float64(n), "heap-objects/entry")
				// A full collection with the index live, less one without it, per 10k entries.
				b.ReportMetric(float64(gcTime()-gcBase)/float64(time.Millisecond)*10_000/float64(n), "gc-ms/10k-entries")
				// What max_bytes counts of the same entries (entrySize), to compare.
				if x, ok := bc.f.index.(*EmbeddedIndex); ok {
					b.ReportMetric(float64(x.Bytes())/float64(n), "counted-bytes/entry")
				}
				runtime.KeepAlive(bc)
			}
		})
	}
}

// gcTime is how long a full collection takes, the least of three.
func gcTime() time.Duration {
	best := time.Duration(math.MaxInt64)
	for range 3 {
		start := time.Now()
		runtime.GC()
		best = min(best, time.Since(start))
	}
	return best
}

// BenchmarkLexicalEmbed is the embedding alone.
func BenchmarkLexicalEmbed(b *testing.B) {
	e := embed.NewLexical()
	for _, q := range []string{"How do I reset my Acme router A123 after a power cut?", "华为手机 B456买了30天还能退货吗"} {
		b.Run(q, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.Embed(context.Background(), q); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
