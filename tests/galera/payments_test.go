package galera

import (
	"testing"

	"github.com/idemkit/idem/tests/chaos"
)

// TestPaymentsOnTwoNodes is the chaos test with its two examples/payments
// instances on two different Galera nodes (one database): concurrent
// duplicates land on both nodes at once, instance 1 is SIGKILLed and
// restarted, the instances' connections on either node are killed (KILL
// CONNECTION). Every key must end with one ledger row and one provider
// charge, replays byte-identical on both instances, nothing stuck.
// 3000 requests by default (IDEM_CHAOS_REQUESTS overrides).
func TestPaymentsOnTwoNodes(t *testing.T) {
	dsns := nodeDSNs(t)
	chaos.Run(t, chaos.LoadConfig(t, 3000), chaos.NewMySQL(t, "Galera", [2]string{dsns[0], dsns[1]}))
}
