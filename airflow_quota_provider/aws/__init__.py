"""What the AWS Batch backend decides without calling AWS."""
