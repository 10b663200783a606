package semantic

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	routerv1 "github.com/mantle-mesh/mantle/pkg/api/mantle/router/v1"
	mantlev1 "github.com/mantle-mesh/mantle/pkg/api/mantle/v1"
)

func embed(t *testing.T, e Embedder, s string) []float32 {
	t.Helper()
	v, err := e.Embed(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestLexicalSimilarity(t *testing.T) {
	t.Parallel()
	e := NewLexical(0)
	tests := []struct {
		name     string
		a, b     string
		min, max float64
	}{
		{"identical", "工伤认定需要多久", "工伤认定需要多久", 0.999, 1},
		{"full and half width alike", "ＧＰＴ４ 价格", "gpt4 价格", 0.999, 1},
		{"Chinese on topic", "工伤认定需要多长时间？", "工伤认定一般在受理之日起60日内作出决定。", 0.2, 0.9},
		{"Chinese off topic", "工伤认定需要多长时间？", "今天天气晴朗，适合出游。", 0, 0.1},
		{"English on topic", "How long does the refund take?", "Refunds take five business days to reach your card.", 0.1, 0.9},
		{"English off topic", "How long does the refund take?", "Our office is closed on Sundays.", 0, 0.1},
		{"empty", "", "anything", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Cosine(embed(t, e, tt.a), embed(t, e, tt.b))
			if got < tt.min || got > tt.max {
				t.Errorf("Cosine(%q, %q) = %.3f, want in [%v, %v]", tt.a, tt.b, got, tt.min, tt.max)
			}
		})
	}
}

func TestNormalizeQuestion(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"工伤认定，需要多久？":        "工伤认定需要多久",
		"  How LONG?  ":     "howlong",
		"ＧＰＴ－４ 多少钱":         "gpt4多少钱",
		"How long does it?": "howlongdoesit",
	} {
		if got := NormalizeQuestion(in); got != want {
			t.Errorf("NormalizeQuestion(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestHistoryDivergenceAndEviction(t *testing.T) {
	t.Parallel()
	e := NewLexical(0)
	h := NewHistory(2, 2)
	if _, seen := h.Observe("q1", embed(t, e, "退款五个工作日到账")); seen {
		t.Fatal("first answer saw history")
	}
	if d, seen := h.Observe("q1", embed(t, e, "退款五个工作日到账")); !seen || d > 0.001 {
		t.Errorf("same answer: divergence %.3f, seen %v; want 0, true", d, seen)
	}
	if d, _ := h.Observe("q1", embed(t, e, "我们周日不营业")); d < 0.8 {
		t.Errorf("unrelated answer: divergence %.3f, want > 0.8", d)
	}
	h.Observe("q2", embed(t, e, "x"))
	h.Observe("q3", embed(t, e, "y")) // evicts q1, the least recently seen
	if h.Len() != 2 {
		t.Errorf("Len = %d, want 2", h.Len())
	}
	if _, seen := h.Observe("q1", embed(t, e, "退款")); seen {
		t.Error("q1 was not evicted")
	}
}

func TestHistoryKeepsCopies(t *testing.T) {
	t.Parallel()
	e := NewLexical(0)
	h := NewHistory(1, 1)
	v := embed(t, e, "退款五个工作日到账")
	h.Observe("q", v)
	copy(v, embed(t, e, "我们周日不营业")) // the caller reuses its vector
	if d, _ := h.Observe("q", embed(t, e, "退款五个工作日到账")); d > 0.001 {
		t.Errorf("divergence %.3f from the stored answer, want 0: History kept the caller's vector", d)
	}
	// The ring is full (one answer per key): this overwrote the stored vector in place.
	if d, _ := h.Observe("q", embed(t, e, "我们周日不营业")); d < 0.8 {
		t.Errorf("divergence %.3f from the replaced answer, want > 0.8", d)
	}
}

// TestHistoryRecyclesTheEvictedQuestion: a new question takes the storage of the one it
// evicts, and starts with none of its answers, holding a copy of its own.
func TestHistoryRecyclesTheEvictedQuestion(t *testing.T) {
	t.Parallel()
	e := NewLexical(0)
	h := NewHistory(1, 2)
	h.Observe("a", embed(t, e, "我们周日不营业"))
	h.Observe("a", embed(t, e, "我们周日不营业"))
	v := embed(t, e, "退款五个工作日到账")
	if _, seen := h.Observe("b", v); seen {
		t.Fatal("a new question saw the answers of the one it evicted")
	}
	copy(v, embed(t, e, "我们周日不营业")) // the caller reuses its vector
	if d, seen := h.Observe("b", embed(t, e, "退款五个工作日到账")); !seen || d > 0.001 {
		t.Errorf("divergence %.3f (seen %v) from b's own answer, want 0: the recycled entry kept a or the caller's vector", d, seen)
	}
	if h.Len() != 1 {
		t.Errorf("Len = %d, want 1", h.Len())
	}
}

type fakeJudge struct {
	score float64
	err   error
}

func (f fakeJudge) Judge(context.Context, string, string) (float64, error) { return f.score, f.err }

func TestScorer(t *testing.T) {
	t.Parallel()
	q := "工伤认定需要多长时间？"
	good := "工伤认定一般在受理工伤认定申请之日起60日内作出决定。"
	offTopic := "今天天气晴朗，适合出游。"
	ref := "社会保险行政部门应当自受理工伤认定申请之日起60日内作出工伤认定的决定"
	tests := []struct {
		name      string
		judge     Judge
		in        Input
		check     func(t *testing.T, r Result)
		wantJudge bool
	}{
		{
			name: "relevant answer is confident",
			in:   Input{Question: q, Answer: good},
			check: func(t *testing.T, r Result) {
				if r.Relevance < 0.8 || r.Confidence < 0.8 || r.HasReferences {
					t.Errorf("%+v: want relevance and confidence >= 0.8, no references", r)
				}
			},
		},
		{
			name: "off-topic answer is not",
			in:   Input{Question: q, Answer: offTopic},
			check: func(t *testing.T, r Result) {
				if r.Confidence >= 0.4 {
					t.Errorf("confidence %.2f, want < 0.4", r.Confidence)
				}
			},
		},
		{
			name: "consistency with a reference",
			in:   Input{Question: q, Answer: good, References: []string{"无关的参考", ref}},
			check: func(t *testing.T, r Result) {
				if !r.HasReferences || r.Consistency < 0.9 {
					t.Errorf("%+v: want consistency from the best reference", r)
				}
			},
		},
		{
			name:  "judge weighs in",
			judge: fakeJudge{score: 0},
			in:    Input{Question: q, Answer: good},
			check: func(t *testing.T, r Result) {
				if !r.Judged || r.Confidence > 0.34 {
					t.Errorf("%+v: a judge score of 0 with weight 2 must pull confidence to <= 1/3", r)
				}
			},
		},
		{
			name:  "judge over budget is skipped",
			judge: fakeJudge{err: ErrOverBudget},
			in:    Input{Question: q, Answer: good},
			check: func(t *testing.T, r Result) {
				if r.Judged || !errors.Is(r.JudgeErr, ErrOverBudget) || r.Confidence < 0.8 {
					t.Errorf("%+v: want the answer scored without the judge", r)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := NewScorer(Config{}, NewLexical(0), NewHistory(10, 3), tt.judge)
			r, err := s.Score(context.Background(), tt.in)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, r)
		})
	}
}

// freshEmbedder hides Lexical's embedInto, so a Scorer given it embeds every text into a
// vector of its own, as Score did before it reused its vectors.
type freshEmbedder struct{ e Embedder }

func (f freshEmbedder) Embed(ctx context.Context, text string) ([]float32, error) {
	return f.e.Embed(ctx, text)
}

// TestScorerReuseMatchesFreshVectors holds Score, which embeds into vectors reused from
// call to call and has History copy the answer's, to the scores it gives when every
// text gets a fresh vector: bit for bit, through a history whose rings fill and wrap.
func TestScorerReuseMatchesFreshVectors(t *testing.T) {
	t.Parallel()
	q := "工伤认定需要多长时间？"
	inputs := []Input{
		{Key: "a", Question: q, Answer: "工伤认定一般在受理工伤认定申请之日起60日内作出决定。"},
		{Key: "a", Question: q, Answer: "今天天气晴朗，适合出游。", References: []string{"社会保险行政部门应当自受理之日起60日内作出决定", "无关"}},
		{Key: "b", Question: "How long does the refund take?", Answer: "Refunds take five business days to reach your card."},
		{Key: "a", Question: q, Answer: ""},
		{Key: "", Question: "", Answer: "no question, no key"},
		{Key: "b", Question: "How long does the refund take?", Answer: "Our office is closed on Sundays.", References: []string{"", "refund five days"}},
		{Key: "a", Question: q, Answer: "工伤认定一般在受理工伤认定申请之日起60日内作出决定。"},
		{Key: "b", Question: "How long does the refund take?", Answer: "Refunds take five business days to reach your card. 退款五个工作日到账。"},
		{Key: "a", Question: q, Answer: "ＧＰＴ４ 价格 mixed 中文 and English 混合"},
	}
	for _, dim := range []int{0, 7} {
		reused := NewScorer(Config{}, NewLexical(dim), NewHistory(10, 2), nil)
		fresh := NewScorer(Config{}, freshEmbedder{NewLexical(dim)}, NewHistory(10, 2), nil)
		for i, in := range inputs {
			got, err := reused.Score(context.Background(), in)
			if err != nil {
				t.Fatal(err)
			}
			want, err := fresh.Score(context.Background(), in)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("dim %d, input %d: reused vectors score %+v, fresh ones %+v", dim, i, got, want)
			}
		}
	}
}

type fakeRouter struct {
	calls   int
	content string
	got     *routerv1.CompleteRequest
	auth    []string
}

func (f *fakeRouter) Complete(ctx context.Context, in *routerv1.CompleteRequest, _ ...grpc.CallOption) (*routerv1.CompleteResponse, error) {
	f.calls++
	f.got = in
	md, _ := metadata.FromOutgoingContext(ctx)
	f.auth = md.Get("authorization")
	return &routerv1.CompleteResponse{Message: &mantlev1.ChatMessage{Role: "assistant", Content: f.content}}, nil
}

func TestRouterJudge(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClock()
	router := &fakeRouter{content: `{"score": 0.7}`}
	j := NewRouterJudge(JudgeConfig{Route: "judge", Scenario: "verifier-judge", Timeout: time.Second, MaxTokens: 20, PerMinute: 2, APIKey: "sk-judge"}, router, clock)
	ctx := context.Background()
	for range 2 {
		score, err := j.Judge(ctx, "q", "a")
		if err != nil || score != 0.7 {
			t.Fatalf("Judge = %v, %v; want 0.7", score, err)
		}
	}
	if _, err := j.Judge(ctx, "q", "a"); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("third call in a minute = %v, want ErrOverBudget", err)
	}
	if router.calls != 2 {
		t.Errorf("router called %d times, want 2: an over-budget judgement must not call", router.calls)
	}
	clock.Advance(time.Minute)
	if _, err := j.Judge(ctx, "q", "a"); err != nil {
		t.Errorf("after a minute: %v, want the budget back", err)
	}
	req := router.got.GetRequest()
	if req.GetModel() != "judge" || req.GetScenario() != "verifier-judge" || req.GetMaxTokens() != 20 ||
		req.GetResponseFormat().GetType() != mantlev1.ResponseFormat_TYPE_JSON_OBJECT || !strings.Contains(req.GetMessages()[1].GetContent(), "QUESTION:\nq") {
		t.Errorf("judge request = %v", req)
	}
	if len(router.auth) != 1 || router.auth[0] != "Bearer sk-judge" {
		t.Errorf("authorization = %v, want the judge's key", router.auth)
	}

	for content, wantErr := range map[string]bool{`{"score": 1.7}`: false, `{"verdict": "good"}`: true, `0.5`: true} {
		router.content = content
		clock.Advance(time.Minute)
		score, err := j.Judge(ctx, "q", "a")
		if (err != nil) != wantErr {
			t.Errorf("answer %s: err = %v, want error %v", content, err, wantErr)
		}
		if err == nil && score != 1 {
			t.Errorf("answer %s: score %v, want clamped to 1", content, score)
		}
	}
}

func BenchmarkScorerScore(b *testing.B) {
	s := NewScorer(Config{}, NewLexical(0), NewHistory(10, 3), nil)
	in := Input{
		Key: "t/chat/howlongdoesdeliverytake", Question: "How long does delivery take?",
		Answer: "Your parcel to Lisbon usually takes three to five working days. 包裹通常需要三到五个工作日。",
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Score(context.Background(), in); err != nil {
			b.Fatal(err)
		}
	}
}
