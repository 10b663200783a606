package cache

import (
	"context"
	"math/rand/v2"
	"testing"
)

// TestBoundedSearchRecall measures what the embedded index's search limits cost against
// the exact search in one partition of 30k entries: a reworded stored question must still
// find the question it rewords, as the exact search does, and every candidate the bounded
// search returns is one the exact search returns with the same score (the bound loses
// candidates, it never invents one).
func TestBoundedSearchRecall(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 30k-entry partition")
	}
	t.Parallel()
	const n = 30_000
	for _, corpus := range []string{"support", "numbered"} {
		t.Run(corpus, func(t *testing.T) {
			questions := indexCorpus(corpus, n)
			bounded, exact := buildIndexes(t, questions)
			r := rand.New(rand.NewPCG(7, 8))
			const queries = 300
			bothFound, exactFound := 0, 0
			for range queries {
				want := r.IntN(n)
				q := lexicalQuery(t, rewordedQuestion(questions[want]))
				got, err := bounded.Search(context.Background(), q)
				if err != nil {
					t.Fatalf("bounded Search: %v", err)
				}
				ref, err := exact.Search(context.Background(), q)
				if err != nil {
					t.Fatalf("exact Search: %v", err)
				}
				exactScores := map[string]float32{}
				for _, c := range ref {
					exactScores[c.Entry.ID] = c.Score
				}
				for _, c := range got {
					if s, ok := exactScores[c.Entry.ID]; ok && s != c.Score {
						t.Fatalf("entry %s: bounded score %v, exact %v", c.Entry.ID, c.Score, s)
					}
				}
				wantID := benchEntry(want).ID
				inExact := len(ref) > 0 && ref[0].Entry.ID == wantID
				if inExact {
					exactFound++
					if len(got) > 0 && got[0].Entry.ID == wantID {
						bothFound++
					}
				}
			}
			if exactFound < queries*9/10 {
				t.Fatalf("the exact search found the reworded question %d times of %d: the test does not measure recall", exactFound, queries)
			}
			recall := float64(bothFound) / float64(exactFound)
			t.Logf("%s: bounded search found %d of the %d questions the exact search found first (recall %.3f)", corpus, bothFound, exactFound, recall)
			if recall < 0.99 {
				t.Errorf("recall %.3f against the exact search, want at least 0.99", recall)
			}
		})
	}
}
