"""The Hub folders we publish: the reference model's (`reference`) and the drafting heads' cards (`heads_cards`)."""
