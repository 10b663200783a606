package rules

import (
	"bytes"
	"testing"

	"go.yaml.in/yaml/v3"
)

// FuzzCompile: any rules document (as a rules file holds it) is compiled or refused, and
// a set that compiled evaluates and applies to any answer within its cost limit.
func FuzzCompile(f *testing.F) {
	for _, seed := range []string{
		"rules:\n  - id: mask\n    condition: text.contains(\"保证\")\n    action: {type: mask, pattern: 保证, value: '[x]', notice: n}\n",
		"rules:\n  - id: field\n    scenarios: [s]\n    condition: has(output.a) && output.a > 1\n    action: {type: mask, field: a.b, value: '0'}\n",
		"rules:\n  - id: review\n    condition: question.size() > 3 || degraded\n    action: {type: review}\n",
		"rules:\n  - id: loop\n    condition: text.split('').map(x, text.split('')).size() > 0\n    action: {type: review}\n",
		"rules: [{id: bad, condition: '1 +', action: {type: review}}]\n", "rules: 3", "",
	} {
		f.Add(seed, `{"a": 2, "b": "保证"}`)
	}
	e, err := NewEngine(DefaultCostLimit)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, doc, answer string) {
		var parsed struct {
			Rules []Rule `yaml:"rules"`
		}
		dec := yaml.NewDecoder(bytes.NewReader([]byte(doc)))
		dec.KnownFields(true)
		if err := dec.Decode(&parsed); err != nil {
			return
		}
		set, err := e.Compile(parsed.Rules)
		if err != nil {
			return
		}
		for _, scenario := range []string{"", "s"} {
			in := &Input{Scenario: scenario, Text: answer, Question: answer}
			res := set.Evaluate(in)
			_ = Apply(in, res.Matches, false)
		}
	})
}
