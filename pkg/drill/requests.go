package drill

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
)

// request is one request of the load, the same on both sides of a run.
type request struct {
	index  int
	prompt string
	stream bool
	json   bool
	// session and step, when set, make the request a model step of an agent session
	// (tool-storm).
	session, step string
}

// requestFor returns request i of scenario s. It depends only on the seed and i, never on
// timing, so both sides send exactly the same requests in the same order.
func requestFor(s *Scenario, i int) request {
	rng := rand.New(rand.NewPCG(uint64(s.Seed), uint64(i)))
	words := make([]string, s.Load.PromptWords)
	for w := range words {
		words[w] = vocabulary[rng.IntN(len(vocabulary))]
	}
	return request{
		index: i,
		// Distinct random sentences: neither the exact nor the semantic cache can answer
		// one from another, so every request tests the providers.
		prompt: fmt.Sprintf("Question %d: %s?", i, strings.Join(words, " ")),
		stream: rng.Float64() < s.Load.Stream,
		json:   rng.Float64() < s.Load.JSON,
	}
}

// expectedAnswer is the answer a healthy simulated model gives to r: the simulator answers
// deterministically ("sim answer to: " and the prompt; in JSON mode an object with the
// answer and a confidence of 0.9). Comparing with it is the drill's ground truth: an answer
// that differs was refused, truncated, broken or made up, whatever its status code said.
// TestExpectedAnswerMatchesSimulator keeps this in step with pkg/sim.
func expectedAnswer(r request) string {
	echo := strings.Join(strings.Fields(r.prompt), " ")
	if runes := []rune(echo); len(runes) > simPromptEcho {
		echo = string(runes[:simPromptEcho]) + "..."
	}
	text := "sim answer to: " + echo
	if !r.json {
		return text
	}
	b, _ := json.Marshal(struct {
		Answer     string  `json:"answer"`
		Confidence float64 `json:"confidence"`
	}{text, 0.9})
	return string(b)
}

// simPromptEcho is how much of the prompt the simulator's answer repeats.
const simPromptEcho = 120

// promptTokens and answerTokens estimate token counts the way the simulator bills them:
// about four bytes per token, plus four tokens of framing per message.
func promptTokens(r request) int { return (len(r.prompt)+3)/4 + 4 }
func answerTokens(r request) int { return (len(expectedAnswer(r)) + 3) / 4 }

// vocabulary is what prompts are made of: common words, so prompts read like questions,
// and enough of them that two prompts rarely share more than a word or two.
var vocabulary = strings.Fields(`
account address answer apply arrive baggage balance bank battery bill booking border
branch budget cancel card cargo carrier change charge check city claim class clinic
code color contract cost country coupon credit currency customer damage date deadline
delay delivery deposit device discount document driver duty email engine error estimate
exchange expense export factory fare fee file flight form freight fuel gate gift grade
guarantee hotel import income insurance interest invoice item journey key label language
laptop late lease letter license limit loan locker luggage manual market meal member
menu meter mileage mobile model month network notice number office online order package
parcel parking partner password payment pension permit phone plan platform policy portal
price printer profile quote rate receipt refund region rental repair report reservation
return review route salary schedule screen seat service session settings shipment signal
size software station storage store subscription supplier support system tariff tax
teacher ticket timetable token tracking transfer travel upgrade usage vehicle visa
voucher wallet warranty weather website weight window withdrawal year zone
`)
