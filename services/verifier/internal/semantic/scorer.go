package semantic

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Judge scores how well an answer addresses a question, in [0, 1].
type Judge interface {
	Judge(ctx context.Context, question, answer string) (float64, error)
}

// ErrOverBudget: the judge's budget for this period is spent; the answer is scored without it.
var ErrOverBudget = errors.New("judge budget exhausted")

// Config calibrates the scores.
type Config struct {
	// RelevanceFull is the question-answer cosine that counts as fully relevant. Lexical
	// similarities of a short question and a long answer are small: 0.25 suits Lexical; a
	// neural embedder wants about 0.6.
	RelevanceFull float64
	// ConsistencyFull is the answer-reference cosine that counts as fully consistent.
	ConsistencyFull float64
	// JudgeWeight is the judge's weight in the confidence, relevance and consistency
	// weighing 1 each.
	JudgeWeight float64
}

// Input is one answer to score.
type Input struct {
	// Key identifies "the same question" for divergence; "" skips divergence.
	Key        string
	Question   string
	Answer     string
	References []string
}

// Result is the L3 verdict on one answer. Every score is in [0, 1].
type Result struct {
	Relevance     float64
	Consistency   float64
	HasReferences bool
	Divergence    float64
	HasHistory    bool
	JudgeScore    float64
	Judged        bool
	// Confidence is the weighted mean of relevance, consistency (when there are
	// references) and the judge's score (when it ran).
	Confidence float64
	// JudgeErr is why the judge did not run or failed, when it was configured.
	JudgeErr error
}

// Scorer runs the L3 checks.
type Scorer struct {
	cfg     Config
	emb     Embedder
	history *History
	judge   Judge // nil: off
	// scratch holds *scoreScratch; Score runs on several L3 workers at once.
	scratch sync.Pool
}

// NewScorer builds a Scorer; history and judge may be nil.
func NewScorer(cfg Config, emb Embedder, history *History, judge Judge) *Scorer {
	if cfg.RelevanceFull <= 0 {
		cfg.RelevanceFull = 0.25
	}
	if cfg.ConsistencyFull <= 0 {
		cfg.ConsistencyFull = 0.3
	}
	if cfg.JudgeWeight <= 0 {
		cfg.JudgeWeight = 2
	}
	s := &Scorer{cfg: cfg, emb: emb, history: history, judge: judge}
	s.scratch.New = func() any { return new(scoreScratch) }
	return s
}

// scoreScratch holds the vectors of one Score call, reused by the next: none outlives
// the call (History keeps copies).
type scoreScratch struct {
	answer, other []float32
}

// embed embeds text, into *buf when the embedder can write into a caller's vector.
func (s *Scorer) embed(ctx context.Context, buf *[]float32, text string) ([]float32, error) {
	if e, ok := s.emb.(intoEmbedder); ok {
		*buf = e.embedInto(*buf, text)
		return *buf, nil
	}
	return s.emb.Embed(ctx, text)
}

// Score scores one answer. It fails only when the embedder fails; a judge failure is
// reported in Result.JudgeErr and the answer is scored without it.
func (s *Scorer) Score(ctx context.Context, in Input) (Result, error) {
	var res Result
	scratch := s.scratch.Get().(*scoreScratch)
	defer s.scratch.Put(scratch)
	answer, err := s.embed(ctx, &scratch.answer, in.Answer)
	if err != nil {
		return res, fmt.Errorf("embed answer: %w", err)
	}
	question, err := s.embed(ctx, &scratch.other, in.Question)
	if err != nil {
		return res, fmt.Errorf("embed question: %w", err)
	}
	res.Relevance = min(1, Cosine(question, answer)/s.cfg.RelevanceFull)
	weights, sum := 1.0, res.Relevance

	for _, ref := range in.References {
		v, err := s.embed(ctx, &scratch.other, ref)
		if err != nil {
			return res, fmt.Errorf("embed reference: %w", err)
		}
		res.HasReferences = true
		res.Consistency = max(res.Consistency, min(1, Cosine(v, answer)/s.cfg.ConsistencyFull))
	}
	if res.HasReferences {
		weights++
		sum += res.Consistency
	}
	if s.history != nil && in.Key != "" {
		res.Divergence, res.HasHistory = s.history.Observe(in.Key, answer)
	}
	if s.judge != nil {
		score, err := s.judge.Judge(ctx, in.Question, in.Answer)
		if err != nil {
			res.JudgeErr = err
		} else {
			res.JudgeScore, res.Judged = min(1, max(0, score)), true
			weights += s.cfg.JudgeWeight
			sum += s.cfg.JudgeWeight * res.JudgeScore
		}
	}
	res.Confidence = sum / weights
	return res, nil
}
