package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/idemkit/idem/core/problem"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/core"
)

// Payment is one ledger row, and the body of a 201.
type Payment struct {
	ID               string    `json:"id"`
	Amount           int64     `json:"amount"`
	Currency         string    `json:"currency"`
	To               string    `json:"to"`
	ProviderChargeID string    `json:"provider_charge_id"`
	CreatedAt        time.Time `json:"-"`
}

// Ledger is where payments are booked.
type Ledger interface {
	// Record books p for user as part of the current idem execution (ctx is
	// the handler's context): the row must become visible only if the
	// execution's response is committed.
	Record(ctx context.Context, user string, p Payment) error
	// List returns user's payments, oldest first.
	List(ctx context.Context, user string) ([]Payment, error)
}

// Charge is what is sent to the payment provider.
type Charge struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	To       string `json:"to"`
}

// Provider charges money. key is the idempotency key relayed to it
// (core.RelayKey): the provider deduplicates on it.
type Provider interface {
	Charge(ctx context.Context, key string, c Charge) (chargeID string, err error)
}

// Service is the payments business logic, written once. It knows nothing
// of HTTP frameworks: each serve_<framework>.go file only mounts it behind
// that framework's idem adapter.
type Service struct {
	ledger   Ledger
	provider Provider
	// bookLatency is simulated business time between the provider's answer
	// and the booking (-book-latency): the window in which tests kill the
	// owner.
	bookLatency time.Duration
	// noStep (-steps=false) makes the charge a plain call instead of a
	// recovery point: one durable commit less per first execution, traded
	// for the guarantee that a takeover after a crash does not call the
	// provider again (the relayed key still lets it deduplicate).
	noStep bool
	log    *slog.Logger
}

// relayLabel names the provider call for core.RelayKey.
const relayLabel = "charge"

// chargeStep names the provider charge as a recovery point (core.Step).
// Part of the handler's contract: an instance of a later release resumes
// from what an earlier one stored under this name, so its meaning and its
// JSON form (providerCharge) must not change.
const chargeStep = "provider-charge"

// providerCharge is the stored result of the charge step.
type providerCharge struct {
	ID string `json:"id"`
}

// CreatePayment handles POST /v1/payments for user with the request body.
// It must run under idem (ctx carries the lease): the provider gets
// core.RelayKey(ctx, "charge") and the ledger row is written in the
// execution (pgstore.Defer in PostgreSQL mode, sqlitestore.Defer in SQLite
// mode). It returns the status and the JSON body to send; see contentType.
//
//   - 400: the body is not {"amount": integer > 0, "currency", "to"}; final,
//     so idem stores and replays it like any final response.
//   - 502: the provider failed; 5xx leaves the key retryable.
//   - 500: the ledger write failed; retryable too.
//   - 201: the payment.
func (s *Service) CreatePayment(ctx context.Context, user string, body []byte) (int, []byte) {
	c, err := parseCharge(body)
	if err != nil {
		return problemJSON(http.StatusBadRequest, "invalid-payment", "Invalid payment", err.Error())
	}
	relay := core.RelayKey(ctx, relayLabel)
	if relay == "" {
		// Mounted without idem: refuse rather than charge unprotected.
		return problemJSON(http.StatusInternalServerError, "not-protected", "Not protected",
			"the payment handler must run behind the idem middleware")
	}
	chargeID, status, out := s.charge(ctx, user, relay, c)
	if status != 0 {
		return status, out
	}
	if err := sleepCtx(ctx, s.bookLatency); err != nil {
		return problemJSON(http.StatusServiceUnavailable, "interrupted", "Interrupted",
			"the payment was interrupted before booking; retry with the same Idempotency-Key")
	}
	p := Payment{
		ID:               paymentID(ctx),
		Amount:           c.Amount,
		Currency:         c.Currency,
		To:               c.To,
		ProviderChargeID: chargeID,
		CreatedAt:        time.Now().UTC(),
	}
	if err := s.ledger.Record(ctx, user, p); err != nil {
		s.log.ErrorContext(ctx, "ledger write failed", "user", user, "err", err)
		return problemJSON(http.StatusInternalServerError, "ledger-failed", "Ledger write failed",
			"the payment could not be booked; retry with the same Idempotency-Key")
	}
	s.log.InfoContext(ctx, "payment booked", "user", user, "payment", p.ID, "amount", p.Amount,
		"currency", p.Currency, "charge", p.ProviderChargeID)
	out, err = json.Marshal(p)
	if err != nil {
		return problemJSON(http.StatusInternalServerError, "encode", "Encoding failed", err.Error())
	}
	return http.StatusCreated, out
}

// charge calls the provider with the relayed key. By default the call is a
// recovery point: once the provider has answered, its charge id is stored
// (fenced, durably) before the handler goes on, and an instance that takes
// the key over after a crash books that charge instead of calling the
// provider again. The relayed key remains the second wall for a crash
// between the answer and the store. With noStep it is a plain call. A
// non-zero status is the response to send instead of booking.
func (s *Service) charge(ctx context.Context, user, relay string, c Charge) (string, int, []byte) {
	if s.noStep {
		id, err := s.provider.Charge(ctx, relay, c)
		if err != nil {
			st, out := s.providerFailed(ctx, user, err)
			return "", st, out
		}
		return id, 0, nil
	}
	var providerErr error
	charge, err := core.StepJSON(ctx, chargeStep, func(ctx context.Context) (providerCharge, error) {
		id, err := s.provider.Charge(ctx, relay, c)
		providerErr = err
		return providerCharge{ID: id}, err
	})
	if providerErr != nil {
		st, out := s.providerFailed(ctx, user, providerErr)
		return "", st, out
	}
	if err != nil {
		// Charged (perhaps) but not recorded: a retry resumes or, at
		// worst, calls the provider again with the same relayed key.
		s.log.ErrorContext(ctx, "charge step failed", "user", user, "err", err)
		st, out := problemJSON(http.StatusServiceUnavailable, "charge-not-recorded", "Charge not recorded",
			"the provider's answer could not be recorded; retry with the same Idempotency-Key")
		return "", st, out
	}
	return charge.ID, 0, nil
}

func (s *Service) providerFailed(ctx context.Context, user string, err error) (int, []byte) {
	s.log.WarnContext(ctx, "provider charge failed", "user", user, "err", err)
	return problemJSON(http.StatusBadGateway, "provider-failed", "Payment provider failed",
		"the payment provider did not confirm the charge; retry with the same Idempotency-Key")
}

// sleepCtx waits d, or until ctx is done (its cause is returned).
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// ListPayments handles GET /v1/payments for user.
func (s *Service) ListPayments(ctx context.Context, user string) (int, []byte) {
	ps, err := s.ledger.List(ctx, user)
	if err != nil {
		s.log.ErrorContext(ctx, "ledger read failed", "user", user, "err", err)
		return problemJSON(http.StatusInternalServerError, "ledger-failed", "Ledger read failed", "the ledger could not be read")
	}
	if ps == nil {
		ps = []Payment{}
	}
	out, err := json.Marshal(ps)
	if err != nil {
		return problemJSON(http.StatusInternalServerError, "encode", "Encoding failed", err.Error())
	}
	return http.StatusOK, out
}

// userHeader carries the demo's authentication: the user ID, which is also
// idem's scope.
const userHeader = "X-User-ID"

// unauthorized is the response to a request without X-User-ID. It is
// written before idem runs, so it is never stored.
func unauthorized() (int, []byte) {
	return problemJSON(http.StatusUnauthorized, "unauthenticated", "Unauthenticated", "the "+userHeader+" header is required")
}

// contentType is the media type of a body returned by the service.
func contentType(status int) string {
	if status >= 400 {
		return "application/problem+json"
	}
	return "application/json"
}

func healthBody() []byte { return []byte(`{"status":"ok"}`) }

// problemBase prefixes this example's own problem types (idem's are under
// problem.BaseURI).
const problemBase = "https://idemkit.dev/examples/payments/problems/"

func problemJSON(status int, typ, title, detail string) (int, []byte) {
	b, err := json.Marshal(problem.Details{Type: problemBase + typ, Title: title, Status: status, Detail: detail})
	if err != nil {
		b = []byte(`{"status":500}`)
	}
	return status, b
}

// maxAmount keeps amounts well inside every integer type on the way.
const maxAmount = 1 << 53

func parseCharge(body []byte) (Charge, error) {
	var in struct {
		Amount   json.RawMessage `json:"amount"`
		Currency string          `json:"currency"`
		To       string          `json:"to"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&in); err != nil {
		return Charge{}, fmt.Errorf("the body must be a JSON object {\"amount\",\"currency\",\"to\"}: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Charge{}, errors.New("the body must hold a single JSON object")
	}
	if len(in.Amount) == 0 || string(in.Amount) == "null" {
		return Charge{}, errors.New("amount is required")
	}
	// A JSON integer literal only: not "10", 10.5 or 1e3.
	amount, err := strconv.ParseInt(string(in.Amount), 10, 64)
	if err != nil || amount <= 0 || amount > maxAmount {
		return Charge{}, fmt.Errorf("amount must be an integer between 1 and %d, got %s", int64(maxAmount), in.Amount)
	}
	in.Currency = strings.TrimSpace(in.Currency)
	if len(in.Currency) != 3 || strings.ToUpper(in.Currency) != in.Currency || !isLetters(in.Currency) {
		return Charge{}, fmt.Errorf("currency must be an ISO 4217 code such as \"JPY\", got %q", in.Currency)
	}
	in.To = strings.TrimSpace(in.To)
	if in.To == "" || len(in.To) > 200 {
		return Charge{}, errors.New("to must be a non-empty recipient of at most 200 bytes")
	}
	return Charge{Amount: amount, Currency: in.Currency, To: in.To}, nil
}

func isLetters(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}

// paymentID derives the payment's ID from the idem record with
// core.RelayKey (scope, key and the record's incarnation): a re-run of the
// same request (after a provider failure, or by another instance after a
// takeover) books under the same ID, which the ledger's primary key then
// refuses to book twice — a third wall behind idem's record and the
// provider's deduplication. A key reused after its record expired is a new
// payment: a new record, hence a new ID (and a new relayed charge key).
func paymentID(ctx context.Context) string {
	if k := core.RelayKey(ctx, "payment"); k != "" {
		return "pay_" + strings.TrimPrefix(k, "idem_")[:24]
	}
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "pay_" + hex.EncodeToString(b[:])
}
