package cache

import (
	"context"
	"testing"

	"github.com/mantle-mesh/mantle/services/cache/internal/nearmiss"
)

// TestGuardOnEveryPath checks that the near-miss check decides on exact-key hits, semantic
// hits and the degradation ladder's related-answer rung alike: the exact key folds "-5"
// into "5", a similarity of 0.95 does not see € for $, and the approximate floor is lower
// still.
func TestGuardOnEveryPath(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, stored, asked string
		mode                Mode
		want                nearmiss.Reason
	}{
		{"exact key, sign", "-5", "5", ModeNormal, nearmiss.Number},
		{"exact key, percent", "50%", "50", ModeNormal, nearmiss.Unit},
		{"exact key, sign, cache-only", "-20 degrees?", "20 degrees?", ModeCacheOnly, nearmiss.Number},
		{"semantic, currency", "Can I withdraw $500 at the airport?", "Can I withdraw €500 at the airport?", ModeNormal, nearmiss.Unit},
		{"semantic, emoji", "Customer replied 👍 to the refund offer, what next?", "Customer replied 👎 to the refund offer, what next?", ModeNormal, nearmiss.Emoji},
		{"semantic, operator", "What is 200 / 15?", "What is 200 * 15?", ModeNormal, nearmiss.Operator},
		{"semantic, direction", "How long does a transfer from my savings account to my checking account usually take at your bank?", "How long does a transfer from my checking account to my savings account usually take at your bank?", ModeNormal, nearmiss.Direction},
		{"related rung, maximum/minimum", "What is the maximum daily dose of ibuprofen tablets for an adult with a bad headache and a mild fever?", "What is the minimum daily dose of ibuprofen tablets for an adult with a bad headache and a mild fever?", ModeApproximate, nearmiss.Opposite},
		{"related rung, 儿童/成人", "发烧头痛的时候儿童阿司匹林肠溶片每天最多可以吃几片，饭前还是饭后吃比较好", "发烧头痛的时候成人阿司匹林肠溶片每天最多可以吃几片，饭前还是饭后吃比较好", ModeApproximate, nearmiss.Opposite},
		{"related rung, 上班/下班", "公司规定上班路上骑电动车出了交通事故受伤，按照劳动法能不能认定为工伤并报销医疗费用", "公司规定下班路上骑电动车出了交通事故受伤，按照劳动法能不能认定为工伤并报销医疗费用", ModeApproximate, nearmiss.Opposite},
		{"related rung, 2+3/2-3", "2+3等于几", "2-3等于几", ModeApproximate, nearmiss.Operator},
		{"related rung, 门店/网店", "门店买的商品支持七天无理由退货吗", "网店买的商品支持七天无理由退货吗", ModeApproximate, nearmiss.Opposite},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, DefaultConfig())
			f.mustStore(t, "acme", answer(basePrompt(tt.stored)))
			res := f.lookupMode(t, "acme", basePrompt(tt.asked), tt.mode)
			if res.Hit {
				t.Fatalf("Lookup(%q) after storing %q = hit (%s, %.3f); want a miss", tt.asked, tt.stored, res.Match, res.Similarity)
			}
			if res.Rejected == nil || res.Rejected.Reason != string(tt.want) {
				t.Fatalf("Lookup(%q) rejected %+v; want reason %s", tt.asked, res.Rejected, tt.want)
			}
			// The question itself still hits: the check rejects the difference, not the entry.
			if again := f.lookupMode(t, "acme", basePrompt(tt.stored), tt.mode); !again.Hit {
				t.Errorf("Lookup(%q) = miss; want the stored question to hit", tt.stored)
			}
		})
	}
}

// TestGuardOnCoalescedAnswer checks that a waiter whose question shares the exact key
// with the lease holder's but means something else gets a miss, not the other answer.
func TestGuardOnCoalescedAnswer(t *testing.T) {
	t.Parallel()
	f := newFixture(t, DefaultConfig())
	lease := f.lease(t, "acme", "-5")
	w := f.coalesce(context.Background(), "acme", "5", 0)
	f.waiters(t, 1)
	req := answer(basePrompt("-5"))
	req.LeaseID = lease.ID
	f.mustStore(t, "acme", req)
	got := <-w
	if got.err != nil || got.res.Hit {
		t.Fatalf("waiter for %q = (%+v, %v); want a miss", "5", got.res, got.err)
	}
	if got.res.Rejected == nil || got.res.Rejected.Reason != string(nearmiss.Number) {
		t.Errorf("waiter rejected %+v; want reason number", got.res.Rejected)
	}
}

// TestPersonalAnswersPerEndUser checks that a personal answer is kept for the end user who
// asked, found again by that user only, and not kept at all when the caller names nobody;
// general questions stay shared.
func TestPersonalAnswersPerEndUser(t *testing.T) {
	t.Parallel()
	f := newFixture(t, DefaultConfig())
	asked := func(question, user string) Prompt {
		p := basePrompt(question)
		p.EndUser = user
		return p
	}
	const personal = "What is my account balance?"

	anonymous, err := f.svc.Store(context.Background(), "acme", answer(asked(personal, "")))
	if err != nil || anonymous.Stored || anonymous.SkippedReason != SkipPersonalPrompt {
		t.Fatalf("Store without an end user = (%+v, %v); want skipped as %s", anonymous, err, SkipPersonalPrompt)
	}
	f.mustStore(t, "acme", answer(asked(personal, "alice")))
	if res := f.lookupMode(t, "acme", asked(personal, "alice"), ModeNormal); !res.Hit {
		t.Errorf("alice's own lookup = %+v; want her answer", res)
	}
	for _, user := range []string{"bob", ""} {
		for _, mode := range []Mode{ModeNormal, ModeApproximate} {
			if res := f.lookupMode(t, "acme", asked(personal, user), mode); res.Hit {
				t.Errorf("lookup for end user %q (mode %d) = hit; want alice's answer kept from others", user, mode)
			}
		}
	}
	// A paraphrase by bob does not reach alice's entry through the vector search either.
	if res := f.lookupMode(t, "acme", asked("what is my account balance", "bob"), ModeApproximate); res.Hit {
		t.Errorf("bob's paraphrase = hit; want a miss")
	}
	// A user whose name ends like another's fingerprint does not meet it.
	if res := f.lookupMode(t, "acme", asked(personal, "alice\x00"), ModeNormal); res.Hit {
		t.Errorf("lookup for end user %q = hit; want a miss", "alice\x00")
	}

	// A general question is shared across end users as before.
	const general = "Can I change my delivery address?"
	f.mustStore(t, "acme", answer(asked(general, "alice")))
	if res := f.lookupMode(t, "acme", asked(general, "bob"), ModeNormal); !res.Hit {
		t.Errorf("bob's lookup of a general question = %+v; want the shared answer", res)
	}
	// Volatile questions are never kept, whoever asks.
	if res, err := f.svc.Store(context.Background(), "acme", answer(asked("What time is it?", "alice"))); err != nil || res.Stored {
		t.Errorf("Store of a volatile question = (%+v, %v); want skipped", res, err)
	}
}
